"""Subnetwork data parallelism: each worker holds the shared parameters and its plan's components."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from slimpar.train.modes.base import Mode, Suggestion, model_scope_refusal

if TYPE_CHECKING:
    from slimpar.config import Config


DYNAMO_RECOMPILE_LIMIT = 8  # torch._dynamo.config.recompile_limit's default: graphs of one function


class SDP(Mode):
    name = "sdp"
    section = "sdp"
    tied = ("level", "keep", "keep_per_worker", "memory_budget", "min_holders", "assignment", "mask_file", "groups",
            "regime", "fsdp", "holder_shard", "virtual", "virtual_workers")
    why_not_model_scope = "SDP's holder averaging works block by block"

    def model_scope(self, cfg: Config) -> str:
        """A virtual run compiles one graph per worker's subnetwork (at most dynamo's limit of them); the batched
        one and real workers work block by block."""
        s = cfg.sdp
        if not s.virtual:
            return super().model_scope(cfg)
        if s.virtual_batched:
            return model_scope_refusal(cfg, "the batched routes work block by block")
        if s.virtual_workers > DYNAMO_RECOMPILE_LIMIT:
            return (f"train.compile_scope = 'model' compiles one graph per virtual worker, and dynamo keeps "
                    f"{DYNAMO_RECOMPILE_LIMIT} per function; with sdp.virtual_workers = {s.virtual_workers} use "
                    "--train.compile_scope loss")
        return ""

    def kind(self, cfg: Config) -> str:
        s = cfg.sdp
        if s.virtual:
            return "sdp-virtual-batched" if s.virtual_batched else "sdp-virtual"
        return "sdp"

    def in_process(self, cfg: Config) -> bool:
        return cfg.sdp.virtual

    def refits_accumulation(self, cfg: Config) -> bool:
        return not cfg.sdp.virtual

    def workers(self, cfg: Config) -> int:
        """The plan's workers: the simulated ones of a virtual run, else one per ``sdp.fsdp`` ranks."""
        s = cfg.sdp
        return s.virtual_workers if s.virtual else cfg.parallel.workers // max(s.fsdp, 1)

    def checkpoint_names(self, cfg: Config) -> str:
        return "sdp-fsdp" if cfg.sdp.fsdp > 1 or cfg.sdp.holder_shard else "full"

    def layout(self, cfg: Config) -> dict:
        out = super().layout(cfg)
        if cfg.sdp.memory_budget:  # the keeps follow from the budget: the launcher fills them in
            out.pop("keep_per_worker")
        return out

    def layout_text(self, layout: dict) -> str:
        tied = layout.get("sdp", {})
        return (f"SDP ({layout.get('workers')} workers, keep {tied.get('keep')}, {tied.get('level')} level"
                f"{', FSDP ' + str(tied.get('fsdp')) if layout.get('names') == 'sdp-fsdp' else ''}"
                f"{', virtual' if tied.get('virtual') else ''})")

    def state_bytes(self, run, total: int) -> list[int]:
        """The plan's held bytes per worker (the backward regime also keeps every parameter without its gradient
        and moments); ``sdp.fsdp`` shards a worker's over its ranks, ``holder_shard`` each component over its
        holders; a virtual run is one process (batched: one model copy). With a memory budget the keeps are the
        launcher's to choose: every worker holds the shared parameters at least."""
        cfg, s, workers = run.cfg, run.cfg.sdp, run.cfg.parallel.workers
        if s.memory_budget:
            return [4 * run.sdp_shared_bytes // s.fsdp] * workers
        plan = run.sdp
        held = plan.bytes_per_worker
        if s.holder_shard:
            share = [c.param_bytes / max(1, len(plan.holders(i))) for i, c in enumerate(plan.components)]
            held = [plan.shared_bytes + int(sum(share[c] for c in range(len(share)) if plan.mask[w, c]))
                    for w in range(plan.world_size)]
        per = [total + 3 * h if s.regime == "backward" else 4 * h for h in held]
        if s.virtual:
            return [4 * total if s.virtual_batched else sum(per)]
        return [per[r // s.fsdp] // s.fsdp for r in range(cfg.parallel.workers)]

    def held(self, cfg: Config) -> str:
        s = cfg.sdp
        keep = s.keep_per_worker or s.keep
        what = "the shared parameters" if s.memory_budget else f"its SDP subnetwork (keep {keep})"
        return what + (f", sharded over {s.fsdp} ranks" if s.fsdp > 1 else "")

    def worker_step(self, cfg: Config) -> int:
        return cfg.sdp.fsdp

    def fewer_bytes(self, cfg: Config) -> list[Suggestion]:
        s = cfg.sdp
        if s.virtual or s.memory_budget or s.keep_per_worker:
            return []
        n = cfg.parallel.workers // s.fsdp
        keeps = [k for k in (s.keep * 0.75, s.keep * 0.5, s.keep * 0.25) if k * n >= s.min_holders]
        return [(f"--sdp.keep {k:.3g}", replace(cfg, sdp=replace(s, keep=float(f"{k:.3g}")))) for k in keeps]

    def describe(self, cfg: Config) -> tuple[str, int]:
        s = cfg.sdp
        text = f"sdp {s.level} keep {s.keep} {s.regime}"
        if s.virtual:
            per = cfg.train.batch_size // s.virtual_workers
            return f"{text}, {s.virtual_workers} virtual workers in one process", per
        return text, cfg.train.batch_size // max(cfg.parallel.workers, 1)

    def flops_share(self, cfg: Config) -> bool:
        return False  # workers run subnetworks: the full model's FLOPs would overstate the work

    def heaviest_ranks(self, run) -> list[int]:
        """The worker holding the most (the first shard of its replica with ``sdp.fsdp``)."""
        held = run.sdp.bytes_per_worker
        return [held.index(max(held)) * max(run.cfg.sdp.fsdp, 1)]

    def gathers_parameters(self, cfg: Config) -> bool:
        return cfg.sdp.fsdp > 1

    def memory_budget(self, cfg: Config) -> str:
        return cfg.sdp.memory_budget
