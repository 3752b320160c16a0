"""The trainer's adapters: one strategy per parallel mode (single process, DDP, FSDP2, SDP, virtual SDP,
pipeline, virtual pipeline, SDP × pipeline).

Each wraps a library (torch DDP/FSDP2, :mod:`slimpar.sdp`, :mod:`slimpar.pipeline`, :mod:`slimpar.hybrid`)
behind the interface :class:`slimpar.train.strategies.base.Strategy`. :func:`strategy_kind` is the one
place that maps a run config to a strategy.
"""

from __future__ import annotations

from importlib import import_module

__all__ = ["build_strategy", "strategy_kind"]

# kind -> (module, builder): imported on use, so a run loads only what its mode needs
_BUILDERS = {
    "single": ("slimpar.train.strategies.base", "build_plain_strategy"),
    "ddp": ("slimpar.train.strategies.base", "build_plain_strategy"),
    "fsdp": ("slimpar.train.strategies.base", "build_plain_strategy"),
    "sdp": ("slimpar.train.strategies.sdp", "build_sdp_strategy"),
    "sdp-virtual": ("slimpar.train.strategies.sdp_virtual", "build_virtual_sdp_strategy"),
    "sdp-virtual-batched": ("slimpar.train.strategies.sdp_batched", "build_batched_virtual_sdp_strategy"),
    "pipeline": ("slimpar.train.strategies.pipeline", "build_pipeline_strategy"),
    "pipeline-virtual": ("slimpar.train.strategies.pipeline", "build_virtual_pipeline_strategy"),
    "pipeline-sdp": ("slimpar.train.strategies.hybrid", "build_hybrid_strategy"),
}


def strategy_kind(cfg) -> str:
    """Which strategy a config asks for: ``parallel.mode``, refined by ``sdp.virtual`` (and
    ``sdp.virtual_batched``), ``pipeline.virtual`` and ``pipeline.dp``."""
    mode = cfg.parallel.mode
    if mode == "sdp" and cfg.sdp.virtual and cfg.sdp.virtual_batched:
        return "sdp-virtual-batched"
    if mode == "sdp" and cfg.sdp.virtual:
        return "sdp-virtual"
    if mode == "pipeline" and cfg.pipeline.virtual:
        return "pipeline-virtual"
    if mode == "pipeline" and cfg.pipeline.dp == "sdp":
        return "pipeline-sdp"
    return mode


def build_strategy(cfg, model, ctx):
    """The run's strategy, with parallelism applied from outside (subnetwork → activation checkpointing →
    wrapper)."""
    module, name = _BUILDERS[strategy_kind(cfg)]
    return getattr(import_module(module), name)(cfg, model, ctx)
