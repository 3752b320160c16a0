"""The trainer's adapters: one strategy per parallel mode (single process, DDP, FSDP2, SDP, virtual SDP,
pipeline, virtual pipeline, SDP × pipeline).

Each wraps a library (torch DDP/FSDP2, :mod:`slimpar.sdp`, :mod:`slimpar.pipeline`, :mod:`slimpar.hybrid`)
behind the interface :class:`slimpar.train.strategies.base.Strategy`. The run's mode names the strategy
(``slimpar.train.modes``: ``Mode.kind``) and the run plan it is built from is handed in, never rebuilt here.
"""

from __future__ import annotations

from importlib import import_module

__all__ = ["build_strategy"]

# kind (Mode.kind) -> (module, builder): imported on use, so a run loads only what its mode needs
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


def build_strategy(run, model, ctx):
    """The strategy ``run`` (its :class:`~slimpar.train.run_plan.RunPlan`: the mode's ``kind``, the SDP plan and
    codec specs it resolved) asks for, with parallelism applied from outside (subnetwork → activation
    checkpointing → wrapper)."""
    module, name = _BUILDERS[run.kind]
    return getattr(import_module(module), name)(run.cfg, model, ctx, run)
