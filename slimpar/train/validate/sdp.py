"""Start-up checks for SDP runs: options, then the plan itself (built on a meta-device model)."""

from __future__ import annotations

from slimpar.config import Config, ConfigError
from slimpar.config import check_choice as _choice
from slimpar.sdp.plan import PlanError
from slimpar.train.run_plan import run_plan
from slimpar.train.validate.ranges import Range

# The [sdp] numbers, checked in every mode by slimpar.train.validate.checks.check_numbers (a wrong value is a
# mistake even where the section is unused); the SDP-only rules below need parallel.mode = "sdp".
SDP_RANGES: dict[str, Range] = {
    "sdp.keep": Range(0, 1, lo_open=True, why="the fraction of components each worker holds"),
    "sdp.keep_per_worker": Range(0, 1, lo_open=True, why="each worker's fraction of components"),
    "sdp.min_holders": Range(1, why="every component needs a holder"),
    "sdp.groups": Range(0, why="0 = the default grouping"),
    "sdp.refresh_every": Range(1), "sdp.check_every": Range(0, why="0 = never"),
    "sdp.bn_recalibrate": Range(-1, why="batches; 0 = off, -1 = auto"), "sdp.fsdp": Range(1),
    "sdp.virtual_workers": Range(1, why="the simulated workers of sdp.virtual"),
}


def validate_sdp(cfg: Config) -> None:
    """Raise ConfigError for impossible SDP settings, including plans the planner rejects."""
    s, workers = cfg.sdp, cfg.parallel.workers
    _choice("sdp.level", s.level, ("block", "neuron"))
    _choice("sdp.regime", s.regime, ("forward", "backward"))
    _choice("sdp.assignment", s.assignment, ("cyclic", "random", "explicit"))
    _choice("sdp.reduce_dtype", s.reduce_dtype, ("fp32", "bf16"))
    _choice("sdp.eval_rescale", s.eval_rescale, ("none", "survival"))
    if s.bn_recalibrate < -1:
        raise ConfigError(f"sdp.bn_recalibrate must be >= 0 batches or -1 (auto), got {s.bn_recalibrate}")
    if s.virtual:
        _check_virtual(cfg)
    if s.virtual_batched:
        _check_batched(cfg)
    if s.fsdp < 1 or workers % s.fsdp:
        raise ConfigError(f"sdp.fsdp = {s.fsdp} must divide parallel.workers = {workers}")
    if s.fsdp > 1 and s.level != "block":
        raise ConfigError("SDP with FSDP2 (sdp.fsdp > 1) shards block subnetworks; use --sdp.level block")
    if s.fsdp > 1 and s.regime != "forward":
        raise ConfigError("SDP with FSDP2 (sdp.fsdp > 1) shards forward-masked subnetworks; use --sdp.regime "
                          "forward, or --sdp.fsdp 1 for the backward regime")
    if s.holder_shard and (s.level != "block" or s.regime != "forward" or s.fsdp != 1):
        raise ConfigError("sdp.holder_shard shards whole blocks of forward-masked subnetworks over their holders; "
                          "use --sdp.level block --sdp.regime forward --sdp.fsdp 1")
    if s.refresh_every < 1:
        raise ConfigError(f"sdp.refresh_every must be >= 1, got {s.refresh_every}")
    if s.check_every < 0:
        raise ConfigError(f"sdp.check_every must be >= 0, got {s.check_every}")
    if s.assignment == "explicit" and not s.mask_file:
        raise ConfigError("sdp.assignment = 'explicit' needs --sdp.mask_file FILE (one 0/1 row per worker)")
    if s.assignment != "explicit" and s.mask_file:
        raise ConfigError("sdp.mask_file is only read with --sdp.assignment explicit")
    if s.memory_budget:
        _check_memory_budget(cfg)
    _check_plan(cfg)


def _check_memory_budget(cfg: Config) -> None:
    """sdp.memory_budget: valid sizes for the workers, and keeps left for it to choose. Whether the budgets
    can be met is the launcher's prediction (slimpar.train.memory.budget), for any model and setting."""
    from slimpar.sdp.budget import parse_budgets

    s = cfg.sdp
    if s.keep_per_worker:
        raise ConfigError("sdp.memory_budget and sdp.keep_per_worker both choose each worker's keep C_i; "
                          "give one of them")
    if s.assignment == "explicit":
        raise ConfigError("sdp.memory_budget chooses each worker's keep C_i, an explicit mask fixes them; use "
                          "--sdp.assignment cyclic or random")
    if s.virtual:
        raise ConfigError("sdp.memory_budget bounds each worker's process; sdp.virtual = true runs every worker "
                          "in one process: give the keeps with --sdp.keep or --sdp.keep_per_worker")
    try:
        parse_budgets(s.memory_budget, cfg.parallel.workers // max(s.fsdp, 1))
    except PlanError as e:
        raise ConfigError(f"sdp.memory_budget: {e}") from None


def _check_virtual(cfg: Config) -> None:
    """sdp.virtual: N = sdp.virtual_workers simulated workers in one process, no sharding."""
    s, t = cfg.sdp, cfg.train
    if cfg.parallel.workers != 1:
        raise ConfigError("sdp.virtual = true simulates every SDP worker in one process; set --parallel.workers 1 "
                          f"and the simulated workers with --sdp.virtual_workers N (got parallel.workers = "
                          f"{cfg.parallel.workers})")
    if s.fsdp > 1 or s.holder_shard:
        raise ConfigError("sdp.virtual = true does not shard: it cannot be combined with sdp.fsdp > 1 or "
                          "sdp.holder_shard = true")
    if s.virtual_workers < 1:
        raise ConfigError(f"sdp.virtual_workers must be >= 1, got {s.virtual_workers}")
    if t.batch_size % (s.virtual_workers * t.grad_accum):
        raise ConfigError(f"train.batch_size = {t.batch_size} must be divisible by sdp.virtual_workers "
                          f"({s.virtual_workers}) x train.grad_accum ({t.grad_accum})")


def _check_batched(cfg: Config) -> None:
    """sdp.virtual_batched: one model copy for every simulated worker (slimpar.sdp.batched)."""
    s = cfg.sdp
    if not s.virtual:
        raise ConfigError("sdp.virtual_batched = true batches the simulated workers of a virtual SDP run; add "
                          "--sdp.virtual true --parallel.workers 1")
    if cfg.model.arch != "llama":
        raise ConfigError(f"sdp.virtual_batched supports --model.arch llama (got {cfg.model.arch}): a ResNet's "
                          "BatchNorm statistics are each worker's own batch's; run --sdp.virtual_batched false")
    if s.regime == "backward" and s.refresh_every != 1:
        raise ConfigError(f"sdp.virtual_batched keeps one copy of every tensor, so non-holders' copies are never "
                          f"stale: it equals the backward regime with --sdp.refresh_every 1 only (got "
                          f"{s.refresh_every}); run --sdp.virtual_batched false for stale copies")


def _check_plan(cfg: Config) -> None:
    """The run plan's SDP plan, built here once for the process (slimpar.train.run_plan); with
    ``sdp.memory_budget`` the launcher chooses the keeps and builds it (slimpar.train.memory.budget)."""
    if cfg.sdp.memory_budget:
        return
    try:
        _ = run_plan(cfg).sdp
    except (PlanError, OSError) as e:
        raise ConfigError(f"SDP plan: {e}") from None
    except ValueError as e:  # an unreadable mask file: not text, not a plain .npy (e.g. pickled objects)
        raise ConfigError(f"SDP plan: cannot read sdp.mask_file {cfg.sdp.mask_file!r} ({e}); give a text file of "
                          "0/1 rows (one per worker) or a .npy 0/1 matrix") from None
