"""SDP behind the trainer's Strategy interface (the plan a run config asks for: sdp_plan.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from slimpar.parallel.ac import apply_ac, model_blocks
from slimpar.parallel.compile import apply_compile
from slimpar.parallel.groups import GroupFactory
from slimpar.parallel.precision import DTYPES, fsdp_kwargs
from slimpar.train.strategies.base import Strategy, mixed_precision_policy
from slimpar.train.strategies.sdp_plan import (
    BN_AUTO_BATCHES,
    bn_batches,
    has_batchnorm,
    keep_report,
    keep_text,
    refresh_root_bytes,
)

if TYPE_CHECKING:
    from slimpar.config import Config


class SDPStrategy(Strategy):
    """SDP over real processes. Evaluation runs on worker 0 alone, on the full model gathered to it point to
    point: the other ranks send what it needs and hold nothing beyond their subnetwork, so a run whose workers
    fit only their subnetworks still evaluates as long as worker 0 fits the full model's parameters beside its
    own (docs/gpu.md measures the peak); they return no results (only rank 0 writes them)."""

    name = "sdp"
    eval_sharded = True
    eval_dst: int | None = 0  # the worker evaluation gathers to (None: every rank, the one-process strategies)

    def __init__(self, cfg: Config, model: nn.Module, ctx, run):
        super().__init__(model, ctx.group, cfg)
        self.ctx = ctx
        if run.sdp.world_size != self._workers():
            raise RuntimeError(f"the run plan's SDP plan has {run.sdp.world_size} workers, this job "
                               f"{self._workers()}: plan the run from the job's config")
        self.plan = run.sdp  # the run plan's (slimpar.train.run_plan), built once in this process
        self.predicted_per_rank = None  # sdp.memory_budget: the launcher's prediction of every rank's memory
        if cfg.sdp.memory_budget and self.plan.memory is None and ctx.is_main:  # the keeps chosen by the launcher
            self.plan.memory, self.predicted_per_rank = _launcher_prediction(ctx.out_dir)
        self.batchnorm = has_batchnorm(model)
        self.wrapper = self._wrap(model)
        self.module = self.wrapper
        self._full: nn.Module | None = None
        self._gathered = False  # also on the ranks that only sent (their _full stays None)
        self._data = None  # the run's data, for BatchNorm recalibration at evaluation

    def _workers(self) -> int:
        return self.ctx.world // self.cfg.sdp.fsdp

    def _wrap(self, model: nn.Module):
        """Fixed order, applied from outside: subnetwork -> activation checkpointing -> compile -> FSDP2 -> holder
        sync."""
        from slimpar.sdp.apply import apply_subnet
        from slimpar.sdp.wrapper import SubnetworkDataParallel

        cfg, ctx, f = self.cfg, self.ctx, self.cfg.sdp.fsdp
        if cfg.sdp.regime == "backward":
            # the backward regime keeps views into the full model's tensors for its refresh; moving the model
            # after they are taken would leave them pointing at the CPU copies on a GPU
            model.to(ctx.device)
        sub = apply_subnet(model, self.plan, ctx.rank // f, regime=cfg.sdp.regime)
        if cfg.train.activation_checkpointing:
            apply_ac(model_blocks(model))
        if cfg.train.compile:
            apply_compile(model_blocks(model), cfg.train.compile_backend)
        model.to(ctx.device)
        # one factory for FSDP2's groups and the holder sync's: holder-sharded FSDP2 and the sync share sets
        groups = GroupFactory(ctx.group, ctx.timeout) if cfg.sdp.holder_shard or f > 1 else None
        if cfg.sdp.holder_shard:
            from slimpar.sdp.holder_fsdp import shard_over_holders

            shard_over_holders(model, self.plan, ctx.rank, ctx.device, ctx.timeout, ctx.group,
                               mp_policy=mixed_precision_policy(cfg), factory=groups)
        if f > 1:
            _shard_within_workers(model, ctx, f, groups, mixed_precision_policy(cfg))
        return SubnetworkDataParallel(model, self.plan, regime=cfg.sdp.regime, group=ctx.group,
                                      refresh_every=cfg.sdp.refresh_every, subnet=sub, fsdp=f,
                                      fsdp_does_averaging=cfg.sdp.holder_shard, timeout=ctx.timeout,
                                      reduce_dtype=DTYPES[cfg.sdp.reduce_dtype], groups=groups)

    @property
    def checkpoint_module(self):
        """What checkpoints save: without FSDP, one copy of the full model and its optimizer state under
        the model's own names, each component from its first holder, loadable with any worker count,
        keep or plan and by single/DDP/FSDP2 runs (slimpar.train.checkpoint.sdp). FSDP layouts keep
        DTensor names (DCP assembles every DTensor from the shards of the ranks that hold its name),
        so they resume only with the same SDP layout (checked by checkpoint.check_layout)."""
        if self.cfg.sdp.fsdp > 1 or self.cfg.sdp.holder_shard:
            return self.wrapper
        from slimpar.train.checkpoint.dcp import OPTIONS
        from slimpar.train.checkpoint.sdp import SDPFullState

        return SDPFullState(self.wrapper, OPTIONS)

    def no_sync(self):
        return self.wrapper.no_sync()

    def after_backward(self) -> None:
        self.wrapper.sync()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return self.wrapper.clip_grad_norm_(max_norm)

    def after_step(self) -> None:
        self.wrapper.refresh()
        self._forget_full()

    def _forget_full(self) -> None:
        """The next evaluation or export gathers afresh, on every rank alike (each gather is collective)."""
        self._full, self._gathered = None, False

    def end_of_step(self, step: int) -> None:
        k = self.cfg.sdp.check_every
        if k and (step + 1) % k == 0:
            self.wrapper.check_replicas()

    def eval_module(self) -> nn.Module | None:
        """The gathered full model on worker ``eval_dst`` (None on the other ranks, which sent their parts)."""
        if not self._gathered:
            to_one = {"dst": self.eval_dst} if self.eval_dst is not None else {}
            self._full = self.wrapper.gather_full_model(self.ctx.device, self.cfg.sdp.eval_rescale, **to_one)
            self._gathered = True
            if self._full is not None:
                self._recalibrate(self._full)
        return self._full

    def _recalibrate(self, full: nn.Module) -> None:
        """BatchNorm statistics of the full model from the first N global training batches (N:
        ``bn_batches``), identical on every worker (slimpar.sdp.gather.recalibrate_batchnorm)."""
        n, data = bn_batches(self.cfg, self.batchnorm), self._data
        if not n or data is None:
            return
        from slimpar.sdp.gather import recalibrate_batchnorm

        t = self.cfg.train
        extra = (self.cfg.data.seq_len,) if self.cfg.data.kind == "text" else ()
        batches = [data.train_batch(step, 0, 1, t.batch_size, *extra)[0].to(self.ctx.device) for step in range(n)]
        recalibrate_batchnorm(full, batches)

    def evaluate(self, data, cfg: Config) -> dict:
        """Validate the gathered full model; for block plans also with the other residual rescaling
        (none vs survival probability k_c / N per block), so both can be compared on one model."""
        from slimpar.train.evaluate import evaluate

        self._data = data
        full = self.eval_module()
        results = evaluate(self, data, cfg, 0, 1) if full is not None else {}  # every batch on worker 0 alone
        blocks = [(c, comp) for c, comp in enumerate(self.plan.components) if comp.index is None]
        if not blocks or min(self.plan.holders_per_component) == self.plan.world_size:
            return results
        if full is None:  # worker 0 rescales its copy below; every rank gathers afresh next time
            self._forget_full()
            return results
        other = "none" if cfg.sdp.eval_rescale == "survival" else "survival"
        for c, comp in blocks:
            k = len(self.plan.holders(c)) / self.plan.world_size
            full.get_submodule(comp.name).residual_scale = k if other == "survival" else 1.0
        self._recalibrate(full)  # the statistics follow the scaling
        alt = evaluate(self, data, cfg, 0, 1)
        self._forget_full()  # the next evaluation or export gathers afresh with the configured scaling
        results.update({f"{k}_rescale_{other}": v for k, v in alt.items() if k.endswith(("_loss", "_accuracy"))})
        return results

    def summary_extras(self) -> dict:
        p = self.plan
        out = {"sdp_plan": {"assignment": p.assignment, **keep_report(p), "keep_per_worker": p.keep_per_worker,
                            "holders_per_component": p.holders_per_component, "connected": p.connected,
                            "spectral_gap": p.spectral_gap, "masking_error": p.masking_error,
                            "bytes_per_worker": p.bytes_per_worker, "warnings": p.warnings(),
                            "bn_recalibrate_batches": bn_batches(self.cfg, self.batchnorm)}}
        if p.memory is None:
            return out
        # sdp.memory_budget: worker i's prediction sits next to per_rank[i * sdp.fsdp]["mem"]
        how = ("FakeTensorMode prediction of this run's step per rank (slimpar.train.memory.budget); a worker's "
               "peak is the largest of its sdp.fsdp ranks'" if p.memory.model == "predicted" else
               "peak = 4 (shared + held param bytes) + held blocks x activation_bytes_per_block + fixed_bytes "
               "(slimpar.sdp.budget)")
        out["sdp_memory"] = {**p.memory.as_dict(), "how": how}
        if self.predicted_per_rank is not None:
            out["sdp_memory"]["predicted_per_rank"] = self.predicted_per_rank
        return out

    def summary_rows(self, summary: dict) -> list[tuple[str, str]]:
        """Closing-table rows that put this run next to DDP for the same model (from the plan)."""
        from slimpar.sdp.plan import analytic_bytes_per_step
        from slimpar.utils import fmt_bytes

        a = analytic_bytes_per_step(self.plan, 0)
        full_params = a["ddp"] if self.plan.world_size > 1 else sum(c.elements for c in self.plan.components) * 4
        ddp_static = 4 * full_params  # fp32 params + grads + AdamW's two moments, every worker
        mine = summary["mem_breakdown"]
        held = sum(mine.get(k) or 0 for k in ("params", "grads", "optimizer"))
        rows = [
            ("SDP plan", f"{self.plan.assignment}, {keep_text(self.plan)}, spectral gap {self.plan.spectral_gap:.3f}"),
            *(("  note", w) for w in self.plan.warnings()),
            ("params+grads+optimizer / worker: SDP (measured)", fmt_bytes(held)),
            ("params+grads+optimizer / worker: DDP (from the plan)", fmt_bytes(ddp_static)),
            ("gradient bytes / step / worker: SDP plan floor", fmt_bytes(a["total"])),
            ("gradient bytes / step / worker: DDP (from the plan)", fmt_bytes(a["ddp"])),
        ]
        memory, per_rank = self.plan.memory, summary.get("per_rank") or []
        if memory is not None:  # sdp.memory_budget: each worker's keep, budget, predicted and measured peak
            f = self.cfg.sdp.fsdp
            for i, (c, b, pred) in enumerate(zip(self.plan.keep_per_worker, memory.budgets,
                                                 memory.predicted_peak_mem_bytes, strict=True)):
                ranks = [r["mem"].get("peak_live") for r in per_rank[i * f:(i + 1) * f]]
                measured = max(ranks) if ranks and None not in ranks else None
                rows.append((f"worker {i}: keep {c:.3g}, budget {fmt_bytes(b)}",
                             f"peak {fmt_bytes(pred)} predicted, {fmt_bytes(measured)} measured"))
        return rows

    def val_gap_fix(self) -> str:
        if self.batchnorm and not bn_batches(self.cfg, self.batchnorm):
            return ("the gathered full model's BatchNorm statistics were estimated on subnetworks: re-estimate them "
                    f"with --sdp.bn_recalibrate {BN_AUTO_BATCHES} (or -1, the default: auto)")
        return super().val_gap_fix()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        full = self.eval_module()
        return dict(full.state_dict()) if full is not None else {}  # rank 0 exports it

    def step_metrics(self) -> dict:
        out = {"sdp_comm_wait_s": self.wrapper.grad_sync.wait_seconds if self.wrapper.grad_sync else 0.0}
        if self.cfg.sdp.regime == "backward":
            out["sdp_refresh_drift"] = self.wrapper.last_drift
        return out

    def extra_metrics(self) -> dict:
        from slimpar.sdp.plan import analytic_bytes_per_step

        f = self.cfg.sdp.fsdp
        a = analytic_bytes_per_step(self.plan, self.ctx.rank // f)
        # plus one float64 all-reduce for the global gradient norm when clipping
        clip = 8 if self.cfg.train.grad_clip and self.ctx.world > 1 else 0
        if f > 1:  # holder averaging runs on FSDP shards (1/f of each tensor, up to padding); FSDP's own traffic adds
            return {"analytic_holder_bytes": a["total"] / f + clip, "analytic_ddp_bytes": a["ddp"] + clip}
        return {"analytic_bytes": a["total"] + clip + self._refresh_bytes(), "analytic_ddp_bytes": a["ddp"] + clip}

    def _refresh_bytes(self) -> int:
        """Backward regime: bytes this rank broadcasts as a refresh root (slimpar.sdp.roots) each step."""
        return refresh_root_bytes(self.cfg, self.plan, self.ctx.rank)


def _shard_within_workers(model: nn.Module, ctx, f: int, groups: GroupFactory, mp_policy=None) -> None:
    """``sdp.fsdp`` = F: FSDP2 over each SDP worker's F ranks (per block, then the root), groups from ``groups``."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    ranks = [tuple(range(w * f, (w + 1) * f)) for w in range(ctx.world // f)]
    mine = groups.create(ranks)[ranks[ctx.rank // f]]
    mesh = DeviceMesh.from_group(mine, ctx.device.type)
    for block in model_blocks(model).values():
        fully_shard(block, mesh=mesh, **fsdp_kwargs(mp_policy))
    fully_shard(model, mesh=mesh, **fsdp_kwargs(mp_policy))


def _launcher_prediction(out_dir):
    """The memory budget's prediction the launcher recorded (slimpar.train.memory.budget): ``Plan.memory`` and
    the per-rank records; (None, None) without a record."""
    from dataclasses import fields

    from slimpar.sdp.budget import MemoryPrediction
    from slimpar.train.memory.budget_record import read_record

    record = read_record(out_dir)
    if record is None:
        return None, None
    return MemoryPrediction(**{f.name: record[f.name] for f in fields(MemoryPrediction)}), record["predicted_per_rank"]


def build_sdp_strategy(cfg: Config, model: nn.Module, ctx, run) -> SDPStrategy:
    """SDP over real processes (the virtual one, ``sdp.virtual``, is built by sdp_virtual.py)."""
    return SDPStrategy(cfg, model, ctx, run)
