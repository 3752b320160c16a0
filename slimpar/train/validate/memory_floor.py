"""The memory floor: the bytes a run's workers hold at the least, summed over the workers that share this machine,
against its memory, before any process starts (exit 2 with a setting that fits).

Each rank holds at least, in fp32, its parameters, their gradients and AdamW's two moments (16 bytes a parameter)
of what it owns, plus one micro-batch's logits and their gradient, plus an idle worker's own memory
(:data:`PROCESS_BYTES`). What a rank owns, by mode (counted on a meta-device model: nothing is allocated):

- single, DDP: the whole model; FSDP2: 1/W of it;
- SDP: the shared parameters and its held components (the plan's ``bytes_per_worker``: the keep); the backward
  regime also keeps every non-held parameter (no gradient or moments for them); ``sdp.fsdp`` F shards a worker's
  state over F ranks, ``sdp.holder_shard`` each component over its k_c holders; virtual SDP runs every worker in
  one process (batched: one model copy);
- pipeline: its stage's blocks, the embedding on the first stage, the norm and head on the last (the tied embedding
  on both); ``pipeline.dp = "sdp"`` keeps ``sdp_keep`` of the stage's blocks; a virtual pipeline is one process.

The ranks on this machine are every rank under slimpar's launcher, one for an in-process run, and under torchrun
this node's ``LOCAL_WORLD_SIZE`` ranks from ``RANK - LOCAL_RANK``. A GPU run compares each rank with its own GPU.
Near the edge the launcher refines this with the FakeTensorMode prediction (slimpar.train.memory.floor_check).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from slimpar.config import Config, ConfigError
from slimpar.train.modes import mode_of
from slimpar.train.run_plan import PROCESS_BYTES, STATE_BYTES_PER_PARAM, run_plan
from slimpar.utils import fmt_bytes

__all__ = ["PROCESS_BYTES", "STATE_BYTES_PER_PARAM", "check_memory_floor", "fitting_settings", "local_ranks",
           "machine_bytes", "need_bytes", "rank_floors"]

# a suggested setting leaves a quarter of the memory for what a step allocates on top of the floor (AdamW's and
# clipping's temporaries: `slimpar plan --memory` predicts 8.1 GiB for a 1b SDP worker whose floor is 6.6 GiB)
SUGGEST_HEADROOM = 0.75


def rank_floors(cfg: Config, vocab: int | None = None) -> list[int]:
    """The least bytes each rank of the run holds (one entry per process: a single entry for in-process runs):
    the run plan's floors (slimpar.train.run_plan.RunPlan.floors)."""
    return run_plan(cfg, vocab).floors


def _logits_bytes(cfg: Config, vocab: int | None) -> int:
    return run_plan(cfg, vocab).logits_bytes


def local_ranks(cfg: Config, in_process: bool) -> list[int]:
    """The ranks (indices into :func:`rank_floors`) whose processes share this machine."""
    from slimpar.parallel.placement import local_rank, local_world_size

    here = local_world_size(default=0)  # torchrun's LOCAL_WORLD_SIZE, or a bare srun's tasks on this node
    if here:
        first = int(os.environ.get("RANK", "0")) - local_rank()
        return list(range(first, first + here))
    return [0] if in_process else list(range(cfg.parallel.workers))


def machine_bytes(cfg: Config) -> int | None:
    """One GPU's memory (``parallel.device = "cuda"``), else this machine's: its RAM, or the memory cgroup's limit
    where lower (a container's ``--memory``); None when unknown."""
    if cfg.parallel.device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return min([ram, *_cgroup_limits()])


def memory_cgroup_files(v2_name: str, v1_name: str) -> list[Path]:
    """This process's memory cgroup file ``v2_name`` (cgroup v2) or ``v1_name`` (v1's memory controller)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            out.append(Path("/sys/fs/cgroup") / path.lstrip("/") / v2_name)
        elif "memory" in controllers.split(","):
            out.append(Path("/sys/fs/cgroup/memory") / path.lstrip("/") / v1_name)
    return out


def _cgroup_limits() -> list[int]:
    out = []
    for f in memory_cgroup_files("memory.max", "memory.limit_in_bytes"):
        try:
            text = f.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # v2 says "max" without a limit
            out.append(int(text))
    return out


def machine_text(cfg: Config) -> str:
    """"23.5 GiB" (this machine), "80.0 GiB per GPU", or "memory" when unknown."""
    total = machine_bytes(cfg)
    return f"{fmt_bytes(total)}{' per GPU' if cfg.parallel.device == 'cuda' else ''}" if total else "memory"


def need_bytes(cfg: Config, vocab: int | None = None) -> tuple[int, list[int]]:
    """(what this machine must hold, the floor of each of its ranks): their sum, or on GPUs the largest."""
    from slimpar.train.validate.processes import runs_in_process

    floors = rank_floors(cfg, vocab)
    local = [floors[r] for r in local_ranks(cfg, runs_in_process(cfg)) if r < len(floors)]
    return (max(local) if cfg.parallel.device == "cuda" else sum(local)), local


def check_memory_floor(cfg: Config, vocab: int | None = None) -> None:
    """Raise ConfigError naming the floor, the machine's memory and settings that fit, where it does not fit."""
    total = machine_bytes(cfg)
    if total is None:
        return
    try:
        need, local = need_bytes(cfg, vocab)
    except (ValueError, OSError):  # settings the SDP or pipeline checks refuse next, with their own message
        return
    if need <= total:
        return
    each = fmt_bytes(local[0]) if len(set(local)) == 1 else f"{fmt_bytes(min(local))} to {fmt_bytes(max(local))}"
    fits = fitting_settings(cfg, vocab, total)
    raise ConfigError(
        f"this run needs at least {fmt_bytes(need)} of memory on this {_where(cfg)} (its predicted peak), which has "
        f"{fmt_bytes(total)}: {len(local)} worker(s) here, each holding at least {each}: {_held(cfg)} with its "
        "gradients and AdamW state, one micro-batch's logits and the process itself. "
        f"{'Settings that fit: ' + ', '.join(fits) + '. Otherwise l' if fits else 'L'}ower --train.batch_size (or "
        "raise --train.grad_accum), --model.size or --model.vocab_size, or use more machines; `slimpar plan "
        "--memory` predicts each worker's peak")


def _where(cfg: Config) -> str:
    return "GPU" if cfg.parallel.device == "cuda" else "machine"


def _held(cfg: Config) -> str:
    return mode_of(cfg).held(cfg)


def fitting_settings(cfg: Config, vocab: int | None, total: int) -> list[str]:
    """Up to three overrides that each make the run fit with room to spare (:data:`SUGGEST_HEADROOM`; the first of
    each kind that does), with their floor."""
    out = []
    for kind in _candidates(cfg):
        for flag, other in kind:
            try:
                need, _ = need_bytes(other, vocab)
            except (ConfigError, ValueError):  # a setting the planner or the model refuses
                continue
            if need <= SUGGEST_HEADROOM * total:
                out.append(f"{flag} (at least {fmt_bytes(need)})")
                break
    return out[:3]


def _candidates(cfg: Config) -> list[list[tuple[str, Config]]]:
    """Settings to try, by kind, each kind from the least change: a lower SDP keep, FSDP2 instead of DDP, fewer
    workers on this machine, more gradient accumulation (smaller micro-batches), a smaller model."""
    p, t, mode = cfg.parallel, cfg.train, mode_of(cfg)
    kinds: list[list[tuple[str, Config]]] = [mode.fewer_bytes(cfg)]
    step = mode.worker_step(cfg)
    if "LOCAL_WORLD_SIZE" not in os.environ:  # under torchrun the launcher sets the worker count
        kinds.append([(f"--parallel.workers {w}", replace(cfg, parallel=replace(p, workers=w)))
                      for w in range(p.workers - step, 0, -step) if t.batch_size % (w * t.grad_accum) == 0])
    kinds.append([(f"--train.grad_accum {a}", replace(cfg, train=replace(t, grad_accum=a)))
                  for a in (t.grad_accum * 2, t.grad_accum * 4, t.grad_accum * 8) if t.batch_size % a == 0])
    if cfg.model.arch == "llama" and not cfg.model.init_from:
        from slimpar.models.llama import LlamaConfig

        sizes = list(LlamaConfig.SIZES)
        smaller = sizes[:sizes.index(cfg.model.size)][::-1] if cfg.model.size in sizes else []
        kinds.append([(f"--model.size {m}", replace(cfg, model=replace(cfg.model, size=m))) for m in smaller])
    return kinds
