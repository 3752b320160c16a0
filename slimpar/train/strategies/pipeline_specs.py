"""The run config as the pipeline library's typed specs: the one place that reads ``[pipeline]`` for it.

slimpar.pipeline never reads a run config; the pipeline strategies translate it here, once:
``codec_specs`` (what both ends of each boundary agree on).
"""

from __future__ import annotations

from slimpar.config import Config
from slimpar.pipeline.spec import CodecSpec, RVQSpec, resolve_rank


def codec_specs(cfg: Config, d: int, vocab: int) -> list[CodecSpec]:
    """One spec per boundary p = 0..P−2 from ``cfg.pipeline``."""
    pc = cfg.pipeline
    r = resolve_rank(pc.codec, d, pc.rank, pc.compression)
    rvq = None
    if pc.rvq.levels:
        q = pc.rvq
        rvq = RVQSpec(q.levels, q.codebook, q.decay, q.commitment, q.sync_every, q.dead_threshold)
    return [
        CodecSpec(kind=pc.codec, boundary=p, dim=d, rank=r, vocab=vocab, seed=cfg.train.seed,
                  anchors=pc.anchors, anchor_dim=pc.anchor_dim, anchor_form=pc.anchor_form,
                  anchor_init=pc.anchor_init,
                  ids_on_wire=pc.ids == "send", rvq=rvq, microbatches=pc.microbatches)
        for p in range(pc.stages - 1)
    ]
