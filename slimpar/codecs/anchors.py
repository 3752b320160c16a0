"""Anchor embeddings: a token-dependent offset o(t) removed before projecting and restored after.

Why (docs/methods.md, 'Factorized anchors'): the residual stream carries the token embedding E[t], a high-rank,
token-driven component no rank-r projection keeps. An anchor models it so that only h − o(t) is
projected; token ids cross the wire as integers (or are read locally), never as d floats.

- ``FactorizedAnchor`` (MAPL, docs/methods.md, 'Factorized anchors'): o(t) = E_small[t] · P with E_small ∈ ℝ^{V×m}
  trainable and P ∈ ℝ^{m×d} frozen with orthonormal rows, derived from (seed, boundary) so it costs
  no communication. V·m parameters per boundary instead of V·d.
- ``FullAnchor``: o(t) = E[t] with a trainable V×d table (the ablation "fully trainable anchors").
- ``FixedTokenTable`` (SSN): a frozen random V×d table, the same for every boundary and for the
  SSN embedding (slimpar.pipeline.ssn).

Initialisation (**Decision**): the symmetric form (subtract on the sender, add on the receiver)
starts from the model's initial token embedding — E_small = E_tok Pᵀ, the part of each embedding in
the row space of P, or E = E_tok for full anchors — because at initialisation the residual stream is
dominated by E_tok[t]. The receiver-only form (ĥ = Ac + o(t), nothing subtracted) starts at zero:
it learns what the projection loses, and an embedding start would add E_tok twice.

``anchor_init = "zero"`` (``--pipeline.anchor_init zero``) starts the symmetric tables at zero too.
Why: with a different frozen P_p at every boundary and E_small^p = E_tok P_pᵀ, the receiver of
boundary p adds o_p(t) to the stream and the sender of boundary p + 1 subtracts o_{p+1}(t), so from
boundary 1 on the projector must carry the leftover token offset o_p(t) − o_{p+1}(t), a high-rank
term it cannot keep (measured: rank-32 energy at boundaries 1–2 fell from 0.94 to 0.78, +1.4 points of
loss). Starting at zero injects no offset at any boundary; an offset appears only as far as the
gradient of the loss asks for one. We chose this over one shared P along the pipeline because a
shared P removes the mismatch only at step 0 — each boundary's E_small is trained on its own and
drifts — and because the zero start is the variant that was measured (neutral in the study) and
applies unchanged to full anchors.

Gradients of a table lookup touch only the rows of the ids in the batch; ``rows_for`` gives those
rows so the symmetric form's gradient exchange sends u·m numbers (u = distinct ids), not V·m.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from slimpar.codecs.projector import PURPOSE_ANCHOR_BASIS, PURPOSE_SSN_TABLE, seeded_generator
from slimpar.codecs.stiefel import random_stiefel

KINDS = ("none", "factorized", "full")
FORMS = ("symmetric", "receiver")


def anchor_basis(d: int, m: int, seed: int, boundary: int) -> Tensor:
    """P ∈ ℝ^{m×d} with orthonormal rows (PPᵀ = I_m), a pure function of (seed, boundary)."""
    return random_stiefel(d, m, seeded_generator(seed, boundary, PURPOSE_ANCHOR_BASIS)).t().contiguous()


class FactorizedAnchor(nn.Module):
    """o(t) = E_small[t] · P: trainable (V, m) table times a frozen (m, d) orthonormal basis."""

    def __init__(self, vocab: int, m: int, d: int, seed: int = 0, boundary: int = 0,
                 embedding: Tensor | None = None):
        super().__init__()
        if not 0 < m <= d:
            raise ValueError(f"anchor width m must satisfy 0 < m <= d, got m={m}, d={d}")
        P = anchor_basis(d, m, seed, boundary)  # (m, d)
        self.register_buffer("P", P)
        start = embedding.detach().float() @ P.t() if embedding is not None else torch.zeros(vocab, m)
        self.E = nn.Parameter(start.contiguous())  # (V, m)

    def forward(self, ids: Tensor) -> Tensor:
        # E[ids] by F.embedding: the same rows, and a backward that sums a repeated id's gradients in a fixed
        # order (indexing's backward adds them with atomics across threads, in an order that varies run to run)
        return F.embedding(ids, self.E) @ self.P  # (..., m) @ (m, d) = (..., d)


class FullAnchor(nn.Module):
    """o(t) = E[t] with a trainable (V, d) table."""

    def __init__(self, vocab: int, d: int, embedding: Tensor | None = None):
        super().__init__()
        start = embedding.detach().float().clone() if embedding is not None else torch.zeros(vocab, d)
        self.E = nn.Parameter(start)  # (V, d)

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.E)  # (..., d): E[ids], summed in a fixed order in backward (as above)


def ssn_token_table(vocab: int, d: int, seed: int, std: float) -> Tensor:
    """SSN's frozen random token table (V, d) with entries N(0, std²), derived from the seed only."""
    g = seeded_generator(seed, 0, PURPOSE_SSN_TABLE)
    return torch.randn(vocab, d, generator=g) * std


class FixedTokenTable(nn.Module):
    """o(t) = F[t] for a frozen table F (V, d): SSN's static embedding shift."""

    def __init__(self, table: Tensor):
        super().__init__()
        self.register_buffer("F", table.detach().clone())  # (V, d)

    def forward(self, ids: Tensor) -> Tensor:
        return self.F[ids]  # (..., d)


def build_anchor(kind: str, vocab: int, d: int, m: int, seed: int, boundary: int,
                 embedding: Tensor | None) -> nn.Module | None:
    """The anchor a boundary asks for (``embedding`` None = zero start, the receiver-only form)."""
    if kind == "none":
        return None
    if kind == "factorized":
        return FactorizedAnchor(vocab, m, d, seed, boundary, embedding)
    if kind == "full":
        return FullAnchor(vocab, d, embedding)
    raise ValueError(f"unknown anchor kind {kind!r}; choose from {', '.join(KINDS)}")


def rows_for(ids: list[Tensor]) -> Tensor:
    """Sorted distinct token ids of a step's microbatches: the only table rows with a gradient."""
    return torch.unique(torch.cat([t.reshape(-1) for t in ids]))  # (u,) int64, ascending
