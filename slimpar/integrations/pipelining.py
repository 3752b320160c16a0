"""MAPL (or any slimpar codec) at the boundaries of a user's own ``torch.distributed.pipelining`` stages.

A pipelining user has one ``nn.Module`` per stage (stage 0 takes token ids, the last returns logits, the others
map the residual stream (mb, T, d) to itself) and a ``PipelineStage`` per module. :func:`codec_stage` puts the
boundary codec halves around the user's module, [decoder of boundary s − 1] → module → [encoder of boundary s]
(:class:`~slimpar.pipeline.split.StageModule`, whose codec state is named ``codecs.recv{s−1}`` /
``codecs.send{s}``), and returns the :class:`~slimpar.pipeline.stage.CodecPipelineStage` that goes into the
user's schedule in place of the ``PipelineStage``, plus the shared-parameter syncs of its boundaries.

Communication per step: inside the schedule, each microbatch's codec message forward (MAPL: c = Aᵀ(h − o), r
numbers per token) and r numbers per token of gradient back, counted in ``counter``; after the schedule, each
boundary's two ends exchange their parts of A's gradient (``SharedParamSync.post`` / ``finish``), so both apply
the same update. Both ends of a boundary build their halves from the same :class:`~slimpar.pipeline.spec.CodecSpec`,
so A starts identical on both without a message.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from slimpar.pipeline.boundary import BoundaryDecoder, BoundaryEncoder
from slimpar.pipeline.spec import CodecSpec, StageContext
from slimpar.pipeline.split import StageModule
from slimpar.pipeline.stage import CodecPipelineStage
from slimpar.pipeline.sync import SharedParamSync
from slimpar.pipeline.wire import ByteCounter


def codec_stage(module: nn.Module, stage: int, num_stages: int, specs: list[CodecSpec], microbatch: tuple[int, int],
                vocab: int, device: torch.device | str = "cpu", group: dist.ProcessGroup | None = None,
                counter: ByteCounter | None = None) -> tuple[CodecPipelineStage, list[SharedParamSync]]:
    """Stage ``stage`` of ``num_stages`` (this rank: group rank ``stage``) with the codecs of ``specs`` (one per
    boundary) around ``module``; ``microbatch`` = (sequences, tokens) of one microbatch, ``vocab`` the logits'
    width. Returns the pipeline stage for the schedule and the syncs to run after each schedule step.
    Codecs that read token ids (anchors, SSN) need ``stage.submod.context.set_batch(x, microbatches)`` on the
    stages that have the ids."""
    group = group if group is not None else dist.group.WORLD
    ctx = StageContext()
    dec = BoundaryDecoder(specs[stage - 1], ctx) if stage > 0 else None
    enc = BoundaryEncoder(specs[stage], ctx) if stage < num_stages - 1 else None
    wrapped = StageModule(module, stage, num_stages, ctx, dec, enc).to(device)
    peers = {s: dist.get_global_rank(group, s) for s in range(num_stages)}
    pp = CodecPipelineStage(wrapped, microbatch, vocab, torch.device(device), group, peers,
                            counter if counter is not None else ByteCounter())
    syncs = []
    if dec is not None and dec.shared_parameters():
        syncs.append(SharedParamSync(dec.shared_parameters(), "receiver", pp.prev))
    if enc is not None and enc.shared_parameters():
        syncs.append(SharedParamSync(enc.shared_parameters(), "sender", pp.next))
    return pp, syncs
