"""What both ends of a pipeline boundary must agree on.

A ``CodecSpec`` fixes a boundary's codec, widths, anchors, RVQ settings and seed. Sender and receiver
build their halves from the same spec, so every seed-derived quantity (A's start, the anchor basis P,
SSN's U and token table) is identical on both ranks without a message. What the codec name means is
``CodecSpec.codec`` (codec_kinds.py). ``StageContext`` carries the token ids of the microbatch a stage
is processing, which anchors and SSN need on both sides.

``resolve_spec`` is the one path from the user's choices to a spec: the trainer calls it with its run config's
``[pipeline]`` values (slimpar.train.strategies.pipeline_specs) and ``CodecSpec.mapl`` with the recommended
defaults, ``slimpar.codec_defaults.CODEC_DEFAULTS``, which the ``[pipeline]`` section defaults to as well; this
module never reads a run config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from slimpar.codec_defaults import CODEC_DEFAULTS
from slimpar.codecs.anchors import rows_for
from slimpar.codecs.packing import UINT16_LIMIT
from slimpar.parallel.device import to_device
from slimpar.parallel.syncs import host_only
from slimpar.pipeline.codec_kinds import CodecKind, codec_kind, codec_settings

if TYPE_CHECKING:
    from slimpar.pipeline.budget import StepShape


@dataclass(frozen=True)
class RVQSpec:
    """Residual vector quantization at a boundary: levels, codebook size, EMA updates and codebook sync."""

    levels: int  # Q residual levels
    codebook: int  # K codes per level
    decay: float  # EMA decay
    commitment: float  # commitment-loss weight β
    sync_every: int  # full codebook every N steps (0: only the first message is full)
    dead_threshold: float = 1.0  # unused codes below this x the mean EMA count are re-seeded
    update_every: int = 2  # EMA update once every N steps (all microbatches together); 0: every microbatch


@dataclass(frozen=True)
class CodecSpec:
    """One boundary's codec, field by field (low-level: the defaults below are not the recommended MAPL).

    ``CodecSpec.mapl(dim, compression, vocab=...)`` gives MAPL as ``slimpar train --pipeline.codec mapl`` runs it:
    factorized receiver-only anchors, token ids read locally and the PCA start, the configuration the quality
    study kept (docs/pipeline.md, 'Defaults'). ``CodecSpec("mapl", ...)`` keeps the fields' own defaults below
    (no anchors, ids on the wire, a random start), which that study measured behind it.
    """

    kind: str  # none | bf16 | int8 | mapl | ssn | naive, or a registered kind (codec_registry.register_codec)
    boundary: int  # p: between stage p and stage p + 1
    dim: int  # d, the residual width
    rank: int  # r, the projected width (d for the non-projecting codecs)
    vocab: int  # V, for anchors, SSN's token table and the id wire format
    seed: int  # run seed: every seed-derived tensor of the boundary depends on (seed, boundary)
    anchors: str = "none"  # none | factorized | full
    anchor_dim: int = 32  # m for factorized anchors
    anchor_form: str = "symmetric"  # symmetric (both ends hold the table) | receiver
    anchor_init: str = "embedding"  # embedding (symmetric tables start at E_tok·Pᵀ) | zero
    ids_on_wire: bool = True  # token ids cross the boundary (2 bytes each) instead of being read locally
    rvq: RVQSpec | None = None  # residual VQ of the codes (projector codecs only)
    microbatches: int = 1  # microbatches per step: paces the full codebook pushes
    # where A starts: random (seed-derived; the identity at r = d) | pca, which the caller carries out with
    # pipeline.pca.calibrate_stage before step 0 (it needs training batches, so building a stage cannot do it)
    projector_init: str = "random"
    # the kind's own settings (its ``CodecKind.settings`` dataclass; None: its defaults, or a kind without any)
    settings: Any = None

    def __post_init__(self) -> None:
        # an unknown name fails here, not as a silent uncompressed boundary; so do settings the kind refuses
        object.__setattr__(self, "settings", codec_settings(self.kind, self.settings or "", self.dim))

    @classmethod
    def mapl(cls, dim: int, compression: int, *, vocab: int, step: StepShape | None = None, boundary: int = 0,
             seed: int = 0, rvq_levels: int = 0, microbatches: int | None = None, **overrides: Any) -> CodecSpec:
        """MAPL with the CLI's defaults (``slimpar.codec_defaults``) that sends 1/``compression`` of ``none``.

        With ``step`` (a ``StepShape``: what the boundary carries per training step) this is the spec that
        ``slimpar train --pipeline.codec mapl --pipeline.compression K`` builds for ``boundary``: r is the largest
        whose every byte per step (payload, A's gradient parts, ids, anchor rows, codebooks) is <= 1/K of the
        uncompressed boundary's, each way (``compression_of = total``, pipeline/budget.py); ValueError when no r
        fits. Those bytes depend on the tokens per step, so without ``step`` r = dim / K, the payload alone
        (the CLI's ``--pipeline.compression_of payload``).

        ``rvq_levels`` > 0 adds residual VQ with the default codebook settings; ``microbatches`` is the
        schedule's count (it paces RVQ's codebook pushes; default: ``step``'s, else 1). ``overrides`` take
        ``resolve_spec``'s keywords, in the ``[pipeline]`` section's terms (``anchors="none"``, ``ids="send"``,
        ``projector_init="random"``, ``rank=``, which wins over ``compression``).
        """
        if microbatches is None:
            microbatches = step.microbatches if step is not None else 1
        if step is not None and step.microbatches != microbatches:
            raise ValueError(f"microbatches = {microbatches} but step carries {step.microbatches} microbatches")
        return resolve_spec("mapl", dim=dim, vocab=vocab, seed=seed, boundary=boundary, compression=compression,
                            step=step, rvq=default_rvq(rvq_levels), microbatches=microbatches, **overrides)

    @property
    def codec(self) -> CodecKind:
        """What ``kind`` means: projector, wire cast (built from ``settings``) and traits (codec_registry.py)."""
        return codec_kind(self.kind).configured(self.settings, self.width)

    @property
    def projected(self) -> bool:
        return codec_kind(self.kind).projects

    @property
    def width(self) -> int:
        """Numbers per token of the float tensor that crosses (and whose gradient comes back)."""
        return self.rank if self.projected else self.dim

    @property
    def needs_ids(self) -> bool:
        """Both ends look token ids up: anchors and SSN's fixed table."""
        return self.anchors != "none" or self.codec.token_table

    @property
    def sends_ids(self) -> bool:
        return self.needs_ids and self.ids_on_wire

    @property
    def ids_dtype(self) -> torch.dtype:
        """uint16 bit patterns in int16 (2 bytes) while V <= 65,536, else int32."""
        return torch.int16 if self.vocab <= UINT16_LIMIT else torch.int32

    @property
    def shares_anchor(self) -> bool:
        """The symmetric form keeps a copy of the anchor table on both ends."""
        return self.anchors != "none" and self.anchor_form == "symmetric"

    @property
    def anchor_start_embedding(self) -> bool:
        """The anchor table starts from the model's token embedding (symmetric form, ``anchor_init`` embedding)."""
        return self.shares_anchor and self.anchor_init == "embedding"

    @property
    def identity_init(self) -> bool:
        """r = d starts A at the identity, which makes the codec exactly lossless at step 0."""
        return self.rank == self.dim


def default_rvq(levels: int, q=CODEC_DEFAULTS.rvq) -> RVQSpec | None:
    """Residual VQ with ``levels`` levels and the codebook settings of ``q`` (default: the recommended ones; the
    trainer passes its ``[pipeline.rvq]`` section); None for 0 levels (no RVQ)."""
    if not levels:
        return None
    return RVQSpec(levels, q.codebook, q.decay, q.commitment, q.sync_every, q.dead_threshold, q.update_every)


def resolve_rank(codec: str, d: int, rank: int, compression: int) -> int:
    """r for a projector codec: ``rank`` when set, else d / compression; d for the other codecs."""
    if not codec_kind(codec).projects:
        return d
    return rank if rank else d // max(compression, 1)


def resolve_anchors(codec: str, anchors: str) -> str:
    """``anchors`` with ``auto`` resolved: factorized anchors for MAPL (the Stiefel projector), none otherwise."""
    if anchors != "auto":
        return anchors
    return "factorized" if codec_kind(codec).stiefel else "none"


def resolve_projector_init(codec: str, d: int, r: int, projector_init: str) -> str:
    """``projector_init`` with ``auto`` resolved: ``pca`` for a Stiefel projector (MAPL) with r < d, else ``random``.

    PCA is the default because it won in ``slimpar bench quality`` (MAPL 4x, d = 128, 2,000 steps, 3 seeds;
    docs/results/quality); at r = d the random start is the identity, so a full-rank codec stays exact. ``r`` is
    the boundary's final rank: the trainer resolves its spec once r is decided (pipeline_specs.codec_specs)."""
    if projector_init != "auto":
        return projector_init
    return "pca" if codec_kind(codec).stiefel and r < d else "random"


_D = CODEC_DEFAULTS  # keeps resolve_spec's signature readable


class NoRankFits(ValueError):
    """Even r = 1 sends more than the byte budget: what does not shrink with r already exceeds it."""


def resolve_spec(codec: str, *, dim: int, vocab: int, seed: int, boundary: int = 0, rank: int = 0,
                 compression: int = 1, step: StepShape | None = None, anchors: str = _D.anchors,
                 anchor_dim: int = _D.anchor_dim, anchor_form: str = _D.anchor_form, anchor_init: str = _D.anchor_init,
                 ids: str = _D.ids, projector_init: str = _D.projector_init, rvq: RVQSpec | None = None,
                 microbatches: int = 1, options: str | Mapping[str, Any] = "") -> CodecSpec:
    """The spec of one boundary from choices in the ``[pipeline]`` section's terms (``auto``, ``ids`` local | send),
    resolved here for the trainer and the library alike; the keywords default to ``CODEC_DEFAULTS``.

    A projector codec's r: ``rank`` when set; else, given ``step`` (what the boundary carries per training
    step), the largest r whose every byte per step is <= 1/compression of ``none``'s each way (pipeline/budget.py;
    ``NoRankFits`` when not even r = 1 is); else dim / compression (the payload alone). The spec is resolved at
    that r, so ``auto``'s PCA start follows the r the boundary uses. ``options`` are the kind's own settings
    (``pipeline.codec_options``: "k=32", or a mapping)."""
    if ids not in ("local", "send"):  # anything else would silently read ids locally
        raise ValueError(f"ids = {ids!r} is not one of: local, send")

    def at(r: int) -> CodecSpec:
        return CodecSpec(kind=codec, boundary=boundary, dim=dim, rank=r, vocab=vocab, seed=seed,
                         anchors=resolve_anchors(codec, anchors), anchor_dim=anchor_dim, anchor_form=anchor_form,
                         anchor_init=anchor_init, ids_on_wire=ids == "send", rvq=rvq, microbatches=microbatches,
                         projector_init=resolve_projector_init(codec, dim, r, projector_init),
                         settings=codec_settings(codec, options, dim))

    spec = at(resolve_rank(codec, dim, rank, compression))
    if step is None or rank or not spec.projected:
        return spec
    return at(_fitted_rank(spec, step, compression))


def _fitted_rank(spec: CodecSpec, step: StepShape, compression: int) -> int:
    from slimpar.pipeline.budget import fit_rank

    r = fit_rank(spec, step, compression)
    if r < 1:
        raise NoRankFits(f"compression {compression}: even rank 1 sends more than 1/{compression} of the "
                         "uncompressed boundary's bytes per step (its payload plus what does not shrink with r: "
                         "token ids, codebooks, anchor rows)")
    return r


WHOLE_BATCH = -1  # ``StageContext.microbatch`` of a one-pass step: every microbatch of the step at once


@dataclass
class StageContext:
    """Per-stage runtime state shared by the stage's codec halves: the current microbatch and its ids.

    ``microbatch`` is ``WHOLE_BATCH`` while the virtual pipeline runs a step's ``microbatches`` in one pass
    (virtual.py): the codec halves then work on the whole (b, T) batch and split its messages per microbatch."""

    microbatch: int = 0
    ids: dict[int, Tensor] = field(default_factory=dict)  # microbatch -> (mb, T) int64 token ids
    microbatches: int = 1  # the step's microbatch count M (how a one-pass message splits)
    batch_ids: Tensor | None = None  # (b, T) ids of the whole batch: the stage's own, or the received ones joined

    def current_ids(self) -> Tensor:
        if self.microbatch == WHOLE_BATCH:
            if self.batch_ids is None:
                self.batch_ids = torch.cat([self.ids[m] for m in range(self.microbatches)])  # received: join them
            return self.batch_ids
        if self.microbatch not in self.ids:
            raise RuntimeError(f"no token ids for microbatch {self.microbatch}: they were neither received "
                               "nor provided by the stage's own loader")
        return self.ids[self.microbatch]

    host_ids: Tensor | None = None  # the step's (b, T) ids on the host, where the stage's loader gave them

    def touched_rows(self) -> Tensor:
        """Sorted distinct token ids of the step's microbatches: the only anchor (or tied embedding) rows
        with a gradient. From the host's copy of the ids where there is one: their number sizes messages, and
        finding it on a GPU would make the host wait."""
        ids = list(self.ids.values())
        if self.host_ids is None or not ids:
            return rows_for(ids)  # (u,) int64
        with host_only():  # the loader's ids, on the host in every run
            rows = rows_for([self.host_ids])
        return to_device(rows, ids[0].device)

    def set_batch(self, x: Tensor, microbatches: int, host: Tensor | None = None) -> None:
        """Split a stage's own (b, T) token batch into the microbatches' ids (pipelining's dim-0 split);
        ``host``: the same batch on the host, if the caller has it."""
        self.ids = dict(enumerate(torch.tensor_split(x, microbatches, dim=0)))
        self.host_ids, self.microbatches, self.batch_ids = host, microbatches, x
