"""The run config as the pipeline library's typed specs: the one place that reads ``[pipeline]`` for it.

slimpar.pipeline never reads a run config; the pipeline strategies translate it here, once:
``codec_specs`` (what both ends of each boundary agree on) and ``training_spec`` (how the optimizer
steps A and the rest: pipeline/training.py).
"""

from __future__ import annotations

import dataclasses

from slimpar.config import Config, ConfigError
from slimpar.pipeline.budget import BudgetShare, StepShape, budget_share
from slimpar.pipeline.spec import CodecSpec, NoRankFits, default_rvq, resolve_spec
from slimpar.pipeline.training import MaplTrainingSpec
from slimpar.train.build import total_steps


def codec_specs(cfg: Config, d: int, vocab: int) -> list[CodecSpec]:
    """One spec per boundary p = 0..P−2 from ``cfg.pipeline``, through ``resolve_spec``: the path
    ``CodecSpec.mapl`` takes too, so the library's MAPL is the CLI's.

    The one place that decides a run's r: ``pipeline.rank``, else (``compression_of = total``, the default) the
    largest r whose every byte per step is <= 1/K of ``none``'s each way for this run's ``step_shape``, else
    (``payload``) d / K. Everything else reads r and the start from these specs."""
    pc = cfg.pipeline
    step = step_shape(cfg) if pc.compression_of == "total" else None
    try:
        spec = resolve_spec(pc.codec, dim=d, vocab=vocab, seed=cfg.train.seed, rank=pc.rank,
                            compression=pc.compression, step=step, anchors=pc.anchors, anchor_dim=pc.anchor_dim,
                            anchor_form=pc.anchor_form, anchor_init=pc.anchor_init, ids=pc.ids,
                            projector_init=pc.projector_init, rvq=default_rvq(pc.rvq.levels, pc.rvq),
                            microbatches=pc.microbatches, options=pc.codec_options)
    except NoRankFits:
        raise ConfigError(f"pipeline.compression = {pc.compression} with compression_of = 'total' (the default): "
                          f"even rank 1 sends more than 1/{pc.compression} of the uncompressed pipeline's bytes per "
                          "step (its payload plus what does not shrink with r: token ids, codebooks, anchor rows); "
                          "lower the compression, read ids locally (--pipeline.ids local) or divide the payload "
                          "alone (--pipeline.compression_of payload)") from None
    return [dataclasses.replace(spec, boundary=p) for p in range(pc.stages - 1)]


def step_shape(cfg: Config) -> StepShape:
    """What each boundary of one pipeline replica carries per training step (text runs)."""
    pc = cfg.pipeline
    replicas = 1 if pc.virtual else max(cfg.parallel.workers // pc.stages, 1)
    rows = cfg.train.batch_size // replicas // pc.microbatches
    return StepShape(rows, cfg.data.seq_len, pc.microbatches, pc.sync_dtype, pc.checksum_every)


def codec_share(cfg: Config, spec: CodecSpec) -> BudgetShare:
    """What each boundary of this run sends per step against ``none`` (the byte model's count) at ``spec``'s r."""
    return budget_share(spec, step_shape(cfg))


def codec_line(cfg: Config, share: BudgetShare) -> str:
    """The start-up line naming a run's codec, what its compression means, its r and its bytes against none."""
    pc = cfg.pipeline
    meaning = "every byte" if pc.compression_of == "total" else "the payload"
    asked = f"rank {pc.rank}" if pc.rank else f"compression {pc.compression} of {meaning} ({pc.compression_of})"
    return f"pipeline codec {pc.codec}, {asked}: {share.line()}"


def training_spec(cfg: Config) -> MaplTrainingSpec:
    """AdamW from ``[train]``, SPEL and A's schedule, freezing and clipping from ``[pipeline]``."""
    t, pc = cfg.train, cfg.pipeline
    return MaplTrainingSpec(lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay, spel_lr=pc.spel_lr,
                            spel_momentum=pc.spel_momentum, polar=pc.polar, spel_schedule=pc.spel_schedule,
                            total_steps=total_steps(cfg), min_lr_ratio=t.min_lr_ratio,
                            freeze_after=pc.freeze_projector_after, clip=pc.clip_projector,
                            batch_spel=pc.virtual)  # one process steps both copies of every A
