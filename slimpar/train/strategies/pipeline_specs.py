"""The run config as the pipeline library's typed specs: the one place that reads ``[pipeline]`` for it.

slimpar.pipeline never reads a run config; the pipeline strategies translate it here, once:
``codec_specs`` (what both ends of each boundary agree on) and ``training_spec`` (how the optimizer
steps A and the rest: pipeline/training.py).
"""

from __future__ import annotations

import dataclasses

from slimpar.config import Config, ConfigError
from slimpar.pipeline.budget import StepShape, fit_rank
from slimpar.pipeline.spec import CodecSpec, default_rvq, resolve_spec
from slimpar.pipeline.training import MaplTrainingSpec
from slimpar.train.build import total_steps


def codec_specs(cfg: Config, d: int, vocab: int) -> list[CodecSpec]:
    """One spec per boundary p = 0..P−2 from ``cfg.pipeline``, through ``resolve_spec``: the path
    ``CodecSpec.mapl`` takes too, so the library's MAPL is the CLI's.

    The one place that decides a run's r: ``pipeline.rank``, else d / K, else (``compression_of = total``) the
    budget's fit (``run_rank``); the spec is then resolved at that r, so what follows from r (``auto``'s PCA
    start for r < d) follows from the r the run uses. Everything else reads r and the start from these specs."""
    r = run_rank(cfg, _resolve(cfg, d, vocab, cfg.pipeline.rank))
    pc = cfg.pipeline
    if r < 1:
        raise ConfigError(f"pipeline.compression = {pc.compression} with compression_of = 'total': even rank 1 sends "
                          f"more than 1/{pc.compression} of the uncompressed pipeline's bytes per step (its payload "
                          "plus what does not shrink with r: token ids, codebooks, anchor rows); lower the "
                          "compression, read ids locally (--pipeline.ids local) or use compression_of = 'payload'")
    spec = _resolve(cfg, d, vocab, r)
    return [dataclasses.replace(spec, boundary=p) for p in range(pc.stages - 1)]


def _resolve(cfg: Config, d: int, vocab: int, rank: int) -> CodecSpec:
    """``resolve_spec`` with every ``[pipeline]`` codec setting at rank ``rank`` (0: d / compression)."""
    pc = cfg.pipeline
    return resolve_spec(pc.codec, dim=d, vocab=vocab, seed=cfg.train.seed, rank=rank, compression=pc.compression,
                        anchors=pc.anchors, anchor_dim=pc.anchor_dim, anchor_form=pc.anchor_form,
                        anchor_init=pc.anchor_init, ids=pc.ids, projector_init=pc.projector_init,
                        rvq=default_rvq(pc.rvq.levels, pc.rvq), microbatches=pc.microbatches,
                        options=pc.codec_options)


def step_shape(cfg: Config) -> StepShape:
    """What each boundary of one pipeline replica carries per training step (text runs)."""
    pc = cfg.pipeline
    replicas = 1 if pc.virtual else max(cfg.parallel.workers // pc.stages, 1)
    rows = cfg.train.batch_size // replicas // pc.microbatches
    return StepShape(rows, cfg.data.seq_len, pc.microbatches, pc.sync_dtype, pc.checksum_every)


def run_rank(cfg: Config, spec: CodecSpec) -> int:
    """r of the run: ``pipeline.rank``, or d / K, or with ``compression_of = total`` the largest r whose every
    byte per step is <= 1/K of ``none``'s each way (pipeline/budget.py); 0 when none fits."""
    pc = cfg.pipeline
    if pc.compression_of != "total" or pc.rank or not spec.projected:
        return spec.rank
    return fit_rank(spec, step_shape(cfg), pc.compression)


def training_spec(cfg: Config) -> MaplTrainingSpec:
    """AdamW from ``[train]``, SPEL and A's schedule, freezing and clipping from ``[pipeline]``."""
    t, pc = cfg.train, cfg.pipeline
    return MaplTrainingSpec(lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay, spel_lr=pc.spel_lr,
                            spel_momentum=pc.spel_momentum, polar=pc.polar, spel_schedule=pc.spel_schedule,
                            total_steps=total_steps(cfg), min_lr_ratio=t.min_lr_ratio,
                            freeze_after=pc.freeze_projector_after, clip=pc.clip_projector,
                            batch_spel=pc.virtual)  # one process steps both copies of every A
