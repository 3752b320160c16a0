"""Compressed pipeline parallelism (MAPL and baselines) on torch.distributed.pipelining.

Python entry points (the CLI's ``--parallel.mode pipeline`` builds the same objects):
``CodecSpec`` (what a boundary's two ends agree on), ``build_stages`` (cut a Llama into
``StageModule``s with their codec halves), ``CodecPipelineStage`` (a ``PipelineStage`` that sends the
codec messages and counts their bytes), ``SharedParamSync`` (keeps both copies of a boundary's
projector identical), ``MaplTrainingSpec`` with ``training.build_optimizer`` / ``start_step`` /
``clip_grad_norm`` (SPEL on A, AdamW on the rest; A's schedule, freezing and clipping),
``VirtualPipeline`` (every stage in one process), ``ByteCounter``, ``StepShape`` (what a boundary carries per
training step: ``CodecSpec.mapl`` fits r to a byte budget with it), ``PipelineLayout`` /
``build_groups`` (the process groups of stages × replicas), and ``CodecKind`` / ``register_codec`` (a codec of
one's own: docs/pipeline.md, "Adding a codec").

``CodecPipelineStage`` is imported on first use (PEP 562): it loads ``torch.distributed.pipelining``, which loads
``torch._dynamo`` (about a second), and a launcher that only validates a pipeline's settings needs neither.
"""

from __future__ import annotations

from typing import Any

from slimpar.pipeline.budget import StepShape
from slimpar.pipeline.codec_registry import CodecKind, register_codec, unregister_codec
from slimpar.pipeline.groups import PipelineLayout, build_groups
from slimpar.pipeline.spec import CodecSpec, RVQSpec, StageContext
from slimpar.pipeline.split import StageModule, build_stages, stage_ranges
from slimpar.pipeline.sync import SharedParamSync
from slimpar.pipeline.training import MaplTrainingSpec
from slimpar.pipeline.virtual import VirtualPipeline
from slimpar.pipeline.wire import ByteCounter

__all__ = ["ByteCounter", "CodecKind", "CodecPipelineStage", "CodecSpec", "MaplTrainingSpec", "PipelineLayout",
           "RVQSpec", "SharedParamSync", "StageContext", "StageModule", "StepShape", "VirtualPipeline", "build_groups",
           "build_stages", "register_codec", "stage_ranges", "unregister_codec"]


def __getattr__(name: str) -> Any:
    if name == "CodecPipelineStage":
        from slimpar.pipeline.stage import CodecPipelineStage

        return CodecPipelineStage
    raise AttributeError(f"module 'slimpar.pipeline' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
