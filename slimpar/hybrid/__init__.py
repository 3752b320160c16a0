"""SDP inside the stages of a (compressed) pipeline: library code composing :mod:`slimpar.sdp` and
:mod:`slimpar.pipeline`, usable without the trainer (docs/pipeline.md, "Hybrid: SDP inside pipeline stages")."""

from slimpar.hybrid.stage_sdp import StageSDP, stage_plans

__all__ = ["StageSDP", "stage_plans"]
