"""The SDP plan a run config asks for, and how a run reports it (the keep asked and held, refresh roots, BatchNorm
recalibration). Pure functions of the config and the plan: no communication."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from torch import nn

from slimpar.sdp.plan import Plan, load_mask_file
from slimpar.sdp.planner import plan_model

if TYPE_CHECKING:
    from slimpar.config import Config


PLAN_LOG = "SLIMPAR_PLAN_LOG"  # a file every plan build appends its process id to (the tests count the builds)
builds = 0  # plan builds in this process


def plan_from_config(cfg: Config, model: nn.Module, workers: int | None = None, predict_peaks=None) -> Plan:
    """The run's plan: ``slimpar.sdp.planner.plan_model`` with the [sdp] settings, the run's seed and, for
    memory budgets, ``predict_peaks`` (slimpar.train.memory.budget) or else the analytic model's tokens of one
    worker's micro-batch (the batch split is the trainer's rule). Pure in (seed, workers, model structure), so
    every rank computes the same. A budget already resolved by the launcher arrives as ``keep_per_worker``."""
    global builds
    builds += 1
    if os.environ.get(PLAN_LOG):
        with open(os.environ[PLAN_LOG], "a") as f:
            f.write(f"{os.getpid()}\n")
    s, t = cfg.sdp, cfg.train
    n = workers or (cfg.parallel.workers // max(s.fsdp, 1))
    budget = s.memory_budget if not s.keep_per_worker else ""
    return plan_model(model, n, s.keep_per_worker or s.keep, level=s.level, groups=s.groups or 4,
                      assignment=s.assignment, seed=t.seed, min_holders=s.min_holders,
                      mask=load_mask_file(s.mask_file) if s.assignment == "explicit" else None,
                      input_shape=None if cfg.model.arch == "llama" else (1, cfg.model.in_channels, 32, 32),
                      memory_budget=budget or None, predict_peaks=predict_peaks,
                      tokens_per_worker=-(-t.batch_size // (n * t.grad_accum)) * cfg.data.seq_len)


BN_AUTO_BATCHES = 20  # sdp.bn_recalibrate = -1 (auto) on a model with BatchNorm


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def bn_batches(cfg: Config, batchnorm: bool) -> int:
    """``sdp.bn_recalibrate`` resolved: an explicit N, or for -1 (auto) ``BN_AUTO_BATCHES`` when the model
    has BatchNorm (``batchnorm``: the gathered full model's statistics are stale otherwise), else 0."""
    n = cfg.sdp.bn_recalibrate
    if n >= 0:
        return n
    return BN_AUTO_BATCHES if batchnorm else 0


def keep_report(plan: Plan) -> dict:
    """The keep asked (None: an explicit mask or memory budgets) and the share each worker holds, as mean and
    range: a keep is rounded to whole components, so workers may hold more or less than asked."""
    held = plan.keep_per_worker
    return {"keep_asked": None if plan.keep_asked is None else list(plan.keep_asked),
            "keep_held": {"mean": sum(held) / len(held), "min": min(held), "max": max(held)}}


def keep_text(plan: Plan) -> str:
    """``keep 0.5 asked, held 0.55 mean (0.2-0.8 over workers)`` for the closing table's plan row."""
    k = keep_report(plan)
    asked, h = k["keep_asked"], k["keep_held"]
    text = "keep "
    if asked is not None:
        text += f"{asked[0]:.3g} asked, " if len(set(asked)) == 1 else f"{min(asked):.3g}-{max(asked):.3g} asked, "
    if h["min"] == h["max"]:
        return text + f"held {h['mean']:.3g} by every worker"
    return text + f"held {h['mean']:.3g} mean ({h['min']:.3g}-{h['max']:.3g} over workers)"


def refresh_root_bytes(cfg: Config, plan: Plan, worker: int) -> int:
    """Bytes ``worker`` feeds into the per-step refresh broadcasts as their root (backward regime)."""
    if cfg.sdp.regime != "backward" or cfg.sdp.refresh_every != 1:
        return 0
    from slimpar.sdp.roots import refresh_roots

    return sum(plan.components[c].elements * 4 for c, root in refresh_roots(plan).items() if root == worker)
