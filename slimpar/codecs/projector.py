"""Boundary projectors: the maps that shrink a pipeline boundary's residual stream from d to r numbers.

All three act per token on the last dimension, ``down: (..., d) -> (..., r)`` on the sender and
``up: (..., r) -> (..., d)`` on the receiver (docs/methods.md, 'Stiefel projector'):

- ``StiefelProjector`` (MAPL): A ∈ St(d, r), down(x) = Aᵀx, up(c) = Ac. Both boundary ranks hold a
  copy of A: SPEL updates it (the optimizer builder finds it by type, ``stiefel_parameters``) and a
  gradient exchange keeps the two copies identical (slimpar.pipeline.sync). Gradients through
  ``down`` are compressed by the same A: the receiver sends ∂L/∂c = Aᵀ ∂L/∂ĥ (r numbers).
- ``NaiveProjector``: an unconstrained learned pair, down(x) = xD on the sender and up(c) = cU on the
  receiver, trained with AdamW. Nothing is shared: each rank owns its half.
- ``FixedSubspace`` (SSN): one seed-derived orthonormal U ∈ St(d, k) for every boundary, never trained.

A projector built with ``role="sender"`` holds only what the sender needs (``"receiver"`` likewise;
``"both"`` for tests). Initial values are pure functions of (seed, boundary), so both ends of a
boundary start from bit-identical copies without communicating.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from slimpar.codecs.fused import stiefel_down, stiefel_lift
from slimpar.codecs.stiefel import identity_stiefel, random_stiefel

ROLES = ("sender", "receiver", "both")

# Generator streams: keeps the projector, anchor and SSN draws of one (seed, boundary) independent.
PURPOSE_PROJECTOR = 1
PURPOSE_ANCHOR_BASIS = 2
PURPOSE_SSN_BASIS = 3
PURPOSE_SSN_TABLE = 4


def seeded_generator(seed: int, boundary: int, purpose: int) -> torch.Generator:
    """CPU generator that is a pure function of (seed, boundary, purpose)."""
    g = torch.Generator()
    g.manual_seed(((seed * 1_000_003 + boundary) * 65_537 + purpose) % (1 << 63))
    return g


def initial_stiefel(d: int, r: int, seed: int, boundary: int, identity: bool = False) -> Tensor:
    """A's starting point: the first r columns of I_d, or a Haar-random point of St(d, r) (QR of a Gaussian)."""
    if identity:
        return identity_stiefel(d, r)
    return random_stiefel(d, r, seeded_generator(seed, boundary, PURPOSE_PROJECTOR))


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")


class StiefelProjector(nn.Module):
    """MAPL's per-boundary A ∈ St(d, r) (d ≥ r): down(x) = Aᵀx, up(c) = Ac, both ends hold A."""

    def __init__(self, d: int, r: int, seed: int = 0, boundary: int = 0, identity: bool = False,
                 role: str = "both"):
        super().__init__()
        _check_role(role)
        if not 0 < r <= d:
            raise ValueError(f"a Stiefel projector needs 0 < r <= d, got d={d}, r={r}")
        self.d, self.r = d, r
        self.A = nn.Parameter(initial_stiefel(d, r, seed, boundary, identity))  # (d, r)

    def down(self, x: Tensor) -> Tensor:
        return stiefel_down(x, self.A)  # (..., d) -> (..., r) = Aᵀx per token, one autograd node (codecs/fused.py)

    def up(self, c: Tensor, anchor: tuple[Tensor, Tensor, Tensor] | None = None) -> Tensor:
        """Ac per token, (..., r) -> (..., d); with ``anchor`` = (E, P, ids) also + E[ids]P in the same node."""
        return stiefel_lift(c, self.A, *(anchor or ()))

    def extra_repr(self) -> str:
        return f"d={self.d}, r={self.r}"


class NaiveProjector(nn.Module):
    """Unconstrained learned down (d×r, sender) and up (r×d, receiver), both started at MAPL's A / Aᵀ."""

    def __init__(self, d: int, r: int, seed: int = 0, boundary: int = 0, identity: bool = False,
                 role: str = "both"):
        super().__init__()
        _check_role(role)
        self.d, self.r = d, r
        A = initial_stiefel(d, r, seed, boundary, identity)  # (d, r): same start as MAPL, then free
        self.down_weight = nn.Parameter(A.clone()) if role in ("sender", "both") else None  # (d, r)
        self.up_weight = nn.Parameter(A.t().contiguous()) if role in ("receiver", "both") else None  # (r, d)

    def down(self, x: Tensor) -> Tensor:
        return x @ self.down_weight  # (..., r)

    def up(self, c: Tensor) -> Tensor:
        return c @ self.up_weight  # (..., d)

    def extra_repr(self) -> str:
        return f"d={self.d}, r={self.r}"


def ssn_basis(d: int, k: int, seed: int) -> Tensor:
    """SSN's global subspace U ∈ St(d, k), one per run (not per boundary), derived from the seed."""
    return random_stiefel(d, k, seeded_generator(seed, 0, PURPOSE_SSN_BASIS))


class FixedSubspace(nn.Module):
    """SSN's fixed projector: down(x) = Uᵀx, up(c) = Uc with U a frozen, seed-derived buffer."""

    def __init__(self, U: Tensor):
        super().__init__()
        self.register_buffer("U", U.detach().clone())  # (d, k), identical on every rank

    def down(self, x: Tensor) -> Tensor:
        return x @ self.U  # (..., k)

    def up(self, c: Tensor) -> Tensor:
        return c @ self.U.t()  # (..., d)


def stiefel_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The A of every StiefelProjector inside ``module`` (the parameters SPEL updates), in module order.

    Found by type rather than by a flag on the tensor: attributes set on a Parameter do not survive
    ``copy.deepcopy`` or a checkpoint round trip.
    """
    return [m.A for m in module.modules() if isinstance(m, StiefelProjector)]
