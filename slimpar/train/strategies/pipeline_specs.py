"""The run config as the pipeline library's typed specs: the one place that reads ``[pipeline]`` for it.

slimpar.pipeline never reads a run config; the pipeline strategies translate it here, once:
``codec_specs`` (what both ends of each boundary agree on) and ``training_spec`` (how the optimizer
steps A and the rest: pipeline/training.py).
"""

from __future__ import annotations

from slimpar.config import Config
from slimpar.pipeline.spec import CodecSpec, RVQSpec, resolve_rank
from slimpar.pipeline.training import MaplTrainingSpec
from slimpar.train.build import total_steps


def codec_specs(cfg: Config, d: int, vocab: int) -> list[CodecSpec]:
    """One spec per boundary p = 0..P−2 from ``cfg.pipeline``."""
    pc = cfg.pipeline
    r = resolve_rank(pc.codec, d, pc.rank, pc.compression)
    rvq = None
    if pc.rvq.levels:
        q = pc.rvq
        rvq = RVQSpec(q.levels, q.codebook, q.decay, q.commitment, q.sync_every, q.dead_threshold, q.update_every)
    return [
        CodecSpec(kind=pc.codec, boundary=p, dim=d, rank=r, vocab=vocab, seed=cfg.train.seed,
                  anchors=pc.anchors, anchor_dim=pc.anchor_dim, anchor_form=pc.anchor_form,
                  anchor_init=pc.anchor_init,
                  ids_on_wire=pc.ids == "send", rvq=rvq, microbatches=pc.microbatches)
        for p in range(pc.stages - 1)
    ]


def training_spec(cfg: Config) -> MaplTrainingSpec:
    """AdamW from ``[train]``, SPEL and A's schedule, freezing and clipping from ``[pipeline]``."""
    t, pc = cfg.train, cfg.pipeline
    return MaplTrainingSpec(lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay, spel_lr=pc.spel_lr,
                            spel_momentum=pc.spel_momentum, polar=pc.polar, spel_schedule=pc.spel_schedule,
                            total_steps=total_steps(cfg), min_lr_ratio=t.min_lr_ratio,
                            freeze_after=pc.freeze_projector_after, clip=pc.clip_projector)
