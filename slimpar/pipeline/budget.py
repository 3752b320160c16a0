"""A boundary's steady-state bytes per training step, and the rank that keeps them inside a budget.

``pipeline.compression = K`` asks for 1/K of the uncompressed pipeline's bytes. Dividing the payload
alone (r = d / K) misses that in both directions once token ids, A's gradient exchange, anchor rows
and RVQ codebooks travel too. ``steady_bytes`` counts every category a boundary sends per step after
the first one, from the same wire specs the codec sends (so the count equals the ``ByteCounter``'s
where nothing depends on the data), and ``fit_rank`` picks the largest r whose count is ≤ 1/K of
``none`` in each direction. Where the bytes depend on the data, the count is the worst case:

- symmetric anchor tables exchange the gradient rows of the step's distinct tokens: min(tokens, V);
- RVQ codebooks: every update changes every row (a delta of all Q·K rows with their ids), plus a full
  table every ``sync_every`` steps and a 32-byte header per message;
- A's gradient parts are counted every step, also after ``freeze_projector_after`` stops them.

So a run asked for 1/K sends at most 1/K; in practice a little less where rows or codebooks move less.
Checksums (one int64 per shared parameter every ``checksum_every`` steps) are counted at their average.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from slimpar.codecs.codebook_sync import HEADER_NUMEL, row_index_dtype
from slimpar.codecs.packing import bits_for, packed_nbytes
from slimpar.pipeline.sync import part_specs
from slimpar.pipeline.wire import WireSpec

# a slimpar.pipeline.spec.CodecSpec: not imported, because spec.py fits a rank with this module's byte count
CodecSpec = Any

HEADER_BYTES = HEADER_NUMEL * 8  # a codebook message's int64 header


@dataclass(frozen=True)
class StepShape:
    """What a boundary carries per training step: ``microbatches`` of (``rows``, ``seq_len``) tokens each."""

    rows: int  # sequences per microbatch
    seq_len: int
    microbatches: int
    sync_dtype: str = "int8"  # how each end's part of A's (and symmetric anchors') gradient crosses
    checksum_every: int = 50  # shared-parameter checksums every N steps; 0 = never

    @property
    def tokens(self) -> int:
        return self.rows * self.seq_len * self.microbatches


def none_bytes(shape: StepShape, d: int) -> int:
    """Bytes per direction per step of one uncompressed boundary: every token's d float32 numbers."""
    return shape.tokens * d * 4


def _nbytes(specs: list[WireSpec]) -> int:
    return sum(s.nbytes() for s in specs)


def _shared_params(spec: CodecSpec, tokens: int) -> list[tuple[int, ...]]:
    """Shapes of the gradient parts each end sends per step (A; a symmetric table's touched rows at most)."""
    shapes = []
    if spec.codec.stiefel:
        shapes.append((spec.dim, spec.rank))
    if spec.shares_anchor:
        rows = min(tokens, spec.vocab)
        shapes.append((rows, spec.anchor_dim) if spec.anchors == "factorized" else (rows, spec.dim))
    return shapes


def _codebook_bytes(spec: CodecSpec, shape: StepShape) -> float:
    """Worst-case codebook bytes per step: every update a delta of all Q·K rows, a full table every
    ``sync_every`` steps, a header with every microbatch's message."""
    q = spec.rvq
    rows = q.levels * q.codebook
    row_bytes = spec.rank * 4
    delta = rows * (torch.empty((), dtype=row_index_dtype(rows)).element_size() + row_bytes)
    updates = shape.microbatches if q.update_every == 0 else 1 / q.update_every
    full = rows * row_bytes / q.sync_every if q.sync_every else 0.0
    return shape.microbatches * HEADER_BYTES + updates * delta + full


def payload_bytes(spec: CodecSpec, shape: StepShape) -> dict[str, float]:
    """{"fwd": bytes, "bwd": bytes} of the payload alone per step: the codes (RVQ's packed indices) and their
    gradients, without ids, codebooks, gradient exchanges or checksums."""
    mb = (shape.rows, shape.seq_len)
    m = shape.microbatches
    wire = spec.codec.wire_bytes(mb, spec.width)  # the payload per microbatch each way, as the kind declares it
    if spec.rvq is not None:
        fwd = packed_nbytes(shape.rows * shape.seq_len * spec.rvq.levels, bits_for(spec.rvq.codebook))
    else:
        fwd = wire["fwd"]
    return {"fwd": float(m * fwd), "bwd": float(m * wire["bwd"])}


def steady_bytes(spec: CodecSpec, shape: StepShape) -> dict[str, float]:
    """{"fwd": bytes, "bwd": bytes} boundary ``spec`` sends per steady-state training step (see module doc)."""
    payload = payload_bytes(spec, shape)
    fwd, bwd = payload["fwd"], payload["bwd"]
    if spec.rvq is not None:
        fwd += _codebook_bytes(spec, shape)
    if spec.sends_ids:
        fwd += shape.microbatches * _nbytes([WireSpec("ids", (shape.rows, shape.seq_len), spec.ids_dtype)])
    shared = _shared_params(spec, shape.tokens)
    sync = sum(_nbytes(part_specs(s, shape.sync_dtype, "sync")) for s in shared)
    checks = 8 * len(shared) / shape.checksum_every if shape.checksum_every and shared else 0.0
    return {"fwd": fwd + sync + checks, "bwd": bwd + sync + checks}


@dataclass(frozen=True)
class BudgetShare:
    """One boundary's steady-state bytes per step against ``none``'s, each way, as ``steady_bytes`` counts them:
    ``fraction`` = every byte it sends / none's; ``payload_share`` = the payload's part of those bytes."""

    rank: int  # r (d for a codec that does not project)
    dim: int
    fraction: dict[str, float]
    payload_share: dict[str, float]

    def line(self) -> str:
        f, p = self.fraction, self.payload_share
        return (f"r = {self.rank} of d = {self.dim}; a boundary sends {f['fwd']:.3f} (fwd) / {f['bwd']:.3f} (bwd) "
                f"of none's bytes per step, the payload {p['fwd']:.1%} / {p['bwd']:.1%} of them")


def budget_share(spec: CodecSpec, shape: StepShape) -> BudgetShare:
    """What boundary ``spec`` sends per step as a fraction of ``none``, and the payload's share of it."""
    sent, payload, none = steady_bytes(spec, shape), payload_bytes(spec, shape), none_bytes(shape, spec.dim)
    return BudgetShare(spec.width, spec.dim, {k: v / none for k, v in sent.items()},
                       {k: payload[k] / v if v else 0.0 for k, v in sent.items()})


def fit_rank(spec: CodecSpec, shape: StepShape, compression: float) -> int:
    """The largest r ≤ d for which ``spec`` at rank r sends ≤ 1/``compression`` of ``none`` each way per
    step; 0 when not even r = 1 fits (ids or codebook headers alone exceed the budget)."""
    if not spec.projected:
        raise ValueError(f"codec {spec.kind!r} has no rank to fit: it sends all d = {spec.dim} numbers")
    budget = none_bytes(shape, spec.dim) / compression
    best = 0
    for r in range(1, spec.dim + 1):  # bytes grow with r; d is at most a few thousand
        sent = steady_bytes(dataclasses.replace(spec, rank=r), shape)
        if max(sent.values()) > budget:
            break
        best = r
    return best
