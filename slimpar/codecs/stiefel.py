"""Stiefel-manifold math: the matrix sign (orthogonal polar factor), tangent projection, diagnostics.

St(d, r) = {A ∈ ℝ^{d×r} : AᵀA = I_r}, d ≥ r (docs/methods.md, 'Stiefel projector').

``msign(X) = X (XᵀX)^{-1/2} = U Vᵀ`` for X = U Σ Vᵀ is the orthogonal polar factor. Two backends:

- ``polar_express``: the Polar Express iteration (Amsel, Persson, Musco, Gower, arXiv 2505.16932) with
  a pinned coefficient table (below; docs/methods.md, 'Polar Express'), run in fp32. Matmuls
  only, so it suits accelerators.
- ``eigh``: the exact polar factor through the small r×r Gram matrix, ``torch.linalg.eigh`` in float64.
  Costs O(d r² + r³), trivial for r ≪ d.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

# Polar Express coefficients (a_t, b_t, c_t) of p_t(x) = a x + b x³ + c x⁵ (docs/methods.md,
# 'Polar Express'), pinned here because the authors' repository HEAD generates a different list.
_PE_TABLE: tuple[tuple[float, float, float], ...] = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
)
# Row used for every t ≥ 8: p(x) = (15x − 10x³ + 3x⁵)/8 has p(1) = 1, p'(1) = p''(1) = 0 (cubic convergence).
_PE_FINAL: tuple[float, float, float] = (1.875, -1.25, 0.375)
_PE_SAFETY = 1.01

# Default iteration count: the 7 tabulated rows plus 3 cubic-convergence steps. Measured in fp32:
# retraction inputs A − ηD (σ ∈ [1, √(1+η²)]) reach the fp32 floor at step 8 (‖QᵀQ − I‖_F ≤ 2.5e-6 up to
# 2048×256); inputs with κ = 1e3 need 9–10 steps once r ≥ 64, because the Frobenius normalisation pushes
# σ_min/‖X‖_F below the table's 1e-3 design floor; 10 steps give ≤ 3.5e-6 up to 1024×256, κ = 1e3.
DEFAULT_POLAR_STEPS = 10
# SPEL's direction D = msign(ξ): the 7 tabulated rows alone. They take every singular value of at least 1e-3·‖ξ‖_F
# to 1 within 1.1e-5 and none above 1 (so ‖D‖₂ ≤ 1, as the retraction's bound assumes); the 3 cubic rows only lift
# the smaller ones (1e-4·‖ξ‖_F: 0.33 after 7 steps, 0.99 after 10), directions that hold under 1e-6 of the
# momentum's energy each. A step direction needs no more; a retraction's output must be orthogonal to the fp32
# floor, so the retraction's fallback keeps DEFAULT_POLAR_STEPS (docs/methods.md, 'Polar Express').
DIRECTION_STEPS = len(_PE_TABLE)

BACKENDS = ("polar_express", "eigh")

# SPEL's retraction (retraction_steps): margin on the singular values of A − ηD beyond η, the largest
# δ = η + margin it takes without normalising (p(1 + δ) stays near 1 up to about 0.5), and the fp32 floor.
RETRACT_MARGIN = 1e-4
RETRACT_MAX_DELTA = 0.5
RETRACT_FLOOR = 1e-7


@contextlib.contextmanager
def pinned_fp32(device_type: str = "cpu") -> Iterator[None]:
    """Full-precision fp32 matmuls inside, whatever the caller enabled: no autocast, no TF32 (CUDA) and no
    bf16 kernels for fp32 (oneDNN). The Stiefel math must keep ‖AᵀA − I‖ under 1e-5; TF32 rounds every
    product to about 1e-3 and bf16 autocast to 4e-3 (measured: 0.05 after Polar Express at 512×64)."""
    cuda, mkldnn = torch.backends.cuda.matmul, torch.backends.mkldnn.matmul
    old = cuda.fp32_precision, mkldnn.fp32_precision
    cuda.fp32_precision = mkldnn.fp32_precision = "ieee"
    try:
        with torch.autocast(device_type, enabled=False):
            yield
    finally:
        cuda.fp32_precision, mkldnn.fp32_precision = old


def polar_express_coefficients(steps: int) -> list[tuple[float, float, float]]:
    """The (a_t, b_t, c_t) for t = 1..steps: table rows divided by (1.01, 1.01³, 1.01⁵), then the final row.

    The safety rescaling (arXiv 2505.16932; docs/methods.md, 'Polar Express') keeps rounding from pushing singular
    values past the interval the next polynomial was designed for; the final row is left unscaled so the
    fixed point stays exactly at σ = 1.
    """
    s = _PE_SAFETY
    rows = [(a / s, b / s**3, c / s**5) for (a, b, c) in _PE_TABLE]
    rows += [_PE_FINAL] * max(0, steps - len(rows))
    return rows[:steps]


def polar_express(X: Tensor, steps: int = DEFAULT_POLAR_STEPS, fro: Tensor | None = None,
                  work: PolarWork | None = None) -> Tensor:
    """msign(X) by Polar Express in fp32 (arXiv 2505.16932; docs/methods.md, 'Polar Express').

    X ← X / (1.01 ‖X‖_F + 1e-7) puts every singular value in [0, 1/1.01]; then for t = 1..steps,
    with S = X Xᵀ the Gram of the short side, X ← a_t X + (b_t S + c_t S²) X, i.e. each singular value
    σ ↦ p_t(σ) while the singular vectors stay fixed. The table is designed for normalised singular
    values in [1e-3, 1]; smaller ones need extra final-row steps; exact zeros stay 0 (p_t is odd).

    Accepts (..., m, n) with any m, n; returns float32 of the same shape. ``fro``: ‖X‖_F of each matrix as
    (..., 1, 1), where the caller has it already (SPEL's move test computes it), else computed here. ``work``: a
    :class:`PolarWork` of X's shape to iterate in (the result is then one of its buffers).
    """
    if X.ndim < 2:
        raise ValueError(f"polar_express needs a matrix (..., m, n), got shape {tuple(X.shape)}")
    with pinned_fp32(X.device.type):
        return _polar_iterate(X, polar_express_coefficients(steps), normalise=True, fro=fro, work=work)


class PolarWork:
    """Two fp32 buffers of one shape, (m, n) or (b, m, n), for Polar Express to write its iterate into in turn
    (``out=``), with their transposed views made once: each step's Gram reads a kept view where it would transpose
    the new iterate, a dispatcher call a step. Making them takes 4 calls, so they pay from 5 steps on; SPEL iterates
    D and then its retraction in one. The values are those of the plain iteration, bit for bit."""

    def __init__(self, like: Tensor):
        work = torch.empty((2, *like.shape), dtype=torch.float32, device=like.device)  # (2, [b,] m, n)
        self.bufs, self.views = work.unbind(0), work.mT.unbind(0)

    def other(self, t: Tensor | None) -> Tensor:
        """The buffer that does not hold ``t``."""
        return self.bufs[1] if t is self.bufs[0] else self.bufs[0]

    def holds(self, t: Tensor) -> bool:
        return any(t is b for b in self.bufs)


def _polar_iterate(X: Tensor, rows: list[tuple[float, float, float]], normalise: bool,
                   fro: Tensor | None = None, work: PolarWork | None = None) -> Tensor:
    """X ← a X + (b S + c S²) X per row (a, b, c), S the Gram of the short side; fp32, any (..., m, n).

    A tall X (m > n) is updated as X ← a X + X (b S + c S²) with S = XᵀX, the same polynomial in its singular
    values, so neither orientation is transposed in and out (two fewer dispatches a call). With ``work`` (of X's
    shape, at most 3 dimensions, X held in one of its buffers unless normalised into one here) the iterate moves
    between its buffers (:func:`_iterate_in`).
    """
    Y = X.to(torch.float32)
    if work is not None and (Y.ndim > 3 or work.bufs[0].shape != Y.shape or not (normalise or work.holds(Y))):
        work = None  # the plain iteration: more than one batch dimension, a work of another shape, or X outside it
    if normalise:
        norm = torch.linalg.matrix_norm(Y, ord="fro", keepdim=True) if fro is None else fro  # (..., 1, 1)
        denom = norm * _PE_SAFETY + 1e-7
        Y = torch.div(Y, denom, out=work.other(Y)) if work is not None else Y / denom
    if work is not None:
        return _iterate_in(work, Y, rows)
    mm, add_mm = (torch.mm, torch.addmm) if Y.ndim == 2 else (torch.bmm, torch.baddbmm)  # fused: 3 ops a step
    flat = Y.reshape(-1, *Y.shape[-2:]) if Y.ndim > 3 else Y  # (n, m, k) or (m, k)
    tall = flat.shape[-2] > flat.shape[-1]
    for a, b, c in rows:
        S = mm(flat.mT, flat) if tall else mm(flat, flat.mT)  # the short side's Gram
        B = add_mm(S, S, S, beta=b, alpha=c)  # b S + c S²
        flat = add_mm(flat, flat, B, beta=a) if tall else add_mm(flat, B, flat, beta=a)  # a Y + Y B or a Y + B Y
    return flat.reshape(Y.shape) if Y.ndim > 3 else flat


def _iterate_in(work: PolarWork, Y: Tensor, rows: list[tuple[float, float, float]]) -> Tensor:
    """:func:`_polar_iterate`'s steps on Y, a buffer of ``work``: each step reads one buffer through its kept
    transposed view and writes the other; returns the buffer holding the result."""
    i = 0 if Y is work.bufs[0] else 1
    mm, add_mm = (torch.mm, torch.addmm) if Y.ndim == 2 else (torch.bmm, torch.baddbmm)
    tall = Y.shape[-2] > Y.shape[-1]
    for a, b, c in rows:
        Y, Yt, out = work.bufs[i], work.views[i], work.bufs[1 - i]
        S = mm(Yt, Y) if tall else mm(Y, Yt)  # the short side's Gram
        B = add_mm(S, S, S, beta=b, alpha=c)  # b S + c S²
        add_mm(Y, Y, B, beta=a, out=out) if tall else add_mm(Y, B, Y, beta=a, out=out)
        i = 1 - i
    return work.bufs[i]


def retraction_steps(eta: float, max_steps: int = DEFAULT_POLAR_STEPS) -> int | None:
    """Final-row steps that take X = A − ηD (A ∈ St(d, r), ‖D‖₂ ≤ 1) to its polar factor at the fp32 floor, or
    None where the bound needs ``max_steps`` or more (then the normalised Polar Express is as cheap).

    By Weyl's inequality every singular value of X lies in [1 − δ, 1 + δ], δ = η + ``RETRACT_MARGIN`` (the margin
    covers A's own distance from St(d, r) and D's rounding past 1). The final row p(x) = (15x − 10x³ + 3x⁵)/8
    is increasing with p(1) = 1, so it maps that interval into [p(1 − δ), p(1 + δ)]: δ ← max(1 − p(1 − δ),
    p(1 + δ) − 1) ≈ 2.5 δ³ a step, computed here on the host in float64 until δ ≤ ``RETRACT_FLOOR``. From
    η = 1e-3 one step is enough; the normalised Polar Express spends seven table rows first because it must
    assume nothing about the singular values.
    """
    delta = abs(eta) + RETRACT_MARGIN
    if delta > RETRACT_MAX_DELTA:
        return None
    a, b, c = _PE_FINAL
    steps = 0
    while steps == 0 or delta > RETRACT_FLOOR:
        lo, hi = 1.0 - delta, 1.0 + delta
        delta = max(1.0 - (a * lo + b * lo**3 + c * lo**5), (a * hi + b * hi**3 + c * hi**5) - 1.0)
        steps += 1
        if steps >= max_steps:
            return None
    return steps


def retract(X: Tensor, eta: float, backend: str = "polar_express", steps: int = DEFAULT_POLAR_STEPS,
            work: PolarWork | None = None) -> Tensor:
    """msign(X) for X = A − ηD, A on St(d, r) and ‖D‖₂ ≤ 1 (SPEL's retraction; docs/methods.md, 'Polar Express').

    ``polar_express``: the final row without normalisation, :func:`retraction_steps` times, where that is
    fewer than ``steps``; else :func:`polar_express` with ``steps``. ``eigh``: :func:`polar_eigh`. The step
    count depends on η alone, so it is chosen on the host and never waits for the device. ``work``: a
    :class:`PolarWork` holding X in one of its buffers, to iterate in.
    """
    if backend != "polar_express":
        return msign(X, backend=backend, steps=steps)
    k = retraction_steps(eta, steps) if isinstance(eta, (int, float)) else None
    if k is None:
        return polar_express(X, steps=steps, work=work)
    with pinned_fp32(X.device.type):
        return _polar_iterate(X, [_PE_FINAL] * k, normalise=False, work=work)


def polar_eigh(X: Tensor) -> Tensor:
    """Exact msign(X) = X (XᵀX)^{-1/2} through the eigendecomposition of the small Gram, in float64.

    With XᵀX = V diag(λ) Vᵀ (n×n for tall X; the wide case is handled on the transpose),
    msign(X) = X V diag(λ^{-1/2}) Vᵀ. Eigenvalues below λ_max · tol (tol covers float64 ``eigh``
    error and the input dtype's rounding) are treated as zero singular values and mapped to 0
    — sign(0) = 0 — instead of being amplified. Returns the input dtype (float32 for non-float input).
    """
    if X.ndim < 2:
        raise ValueError(f"polar_eigh needs a matrix (..., m, n), got shape {tuple(X.shape)}")
    out_dtype = X.dtype if X.is_floating_point() else torch.float32
    Y = X.to(torch.float64)
    wide = Y.shape[-2] < Y.shape[-1]
    if wide:
        Y = Y.mT  # (..., n, m) tall
    m = Y.shape[-2]
    lam, V = torch.linalg.eigh(Y.mT @ Y)  # lam (..., n) ascending, V (..., n, n)
    eps_in = torch.finfo(out_dtype).eps
    tol = max(m * torch.finfo(torch.float64).eps, (m * eps_in) ** 2)
    cutoff = lam[..., -1:].clamp_min(0.0) * tol  # (..., 1)
    keep = lam > cutoff
    safe = lam.clamp_min(torch.finfo(torch.float64).tiny)
    inv_sqrt = torch.where(keep, safe.rsqrt(), torch.zeros_like(lam))  # (..., n)
    Q = Y @ (V * inv_sqrt.unsqueeze(-2)) @ V.mT  # (..., m, n)
    return (Q.mT if wide else Q).to(out_dtype)


def msign(X: Tensor, backend: str = "polar_express", steps: int = DEFAULT_POLAR_STEPS,
          fro: Tensor | None = None, work: PolarWork | None = None) -> Tensor:
    """Matrix sign / orthogonal polar factor U Vᵀ of X = U Σ Vᵀ with the chosen backend.

    ``backend="polar_express"`` (fp32, ``steps`` iterations; ``fro`` and ``work`` as :func:`polar_express` takes
    them) or ``"eigh"`` (exact, float64 inside; ``fro`` and ``work`` unused).
    """
    if backend == "polar_express":
        return polar_express(X, steps=steps, fro=fro, work=work)
    if backend == "eigh":
        return polar_eigh(X)
    raise ValueError(f"unknown msign backend {backend!r}; choose from {', '.join(BACKENDS)}")


def sym(X: Tensor) -> Tensor:
    """Symmetric part (X + Xᵀ)/2 of a square matrix (batched over leading dims)."""
    return 0.5 * (X + X.mT)


def tangent_project(A: Tensor, M: Tensor) -> Tensor:
    """Euclidean-metric projection of M onto the tangent space of St(d, r) at A: M − A sym(AᵀM).

    Computed as M − ½AW − ½AWᵀ with W = AᵀM: two fused products, no symmetrised copy. A, M: (d, r) or (n, d, r).
    The result Ξ satisfies AᵀΞ + ΞᵀA = 0; projecting twice equals projecting once when AᵀA = I.
    """
    if A.ndim not in (2, 3):
        raise ValueError(f"tangent_project takes (d, r) or (n, d, r), got {tuple(A.shape)}")
    mm, add_mm = (torch.mm, torch.addmm) if A.ndim == 2 else (torch.bmm, torch.baddbmm)
    W = mm(A.mT, M)  # (..., r, r)
    return add_mm(add_mm(M, A, W, alpha=-0.5), A, W.mT, alpha=-0.5)


def orth_error(A: Tensor) -> float:
    """‖AᵀA − I‖_F in float64 (the Gram of the short side, so wide A gives ‖AAᵀ − I‖_F).

    For batched input (..., d, r) the maximum over the batch is returned.
    """
    return float(orth_error_tensor(A))


def orth_error_tensor(A: Tensor) -> Tensor:
    """:func:`orth_error` as a 0-d float64 tensor on A's device (no wait for the device)."""
    with torch.no_grad():  # few ops (it runs every SPEL step): no detach, no identity matrix, no broadcast matmul
        Y = A.to(torch.float64)
        if Y.ndim > 3:
            Y = Y.reshape(-1, *Y.shape[-2:])
        mm = torch.mm if Y.ndim == 2 else torch.bmm
        G = mm(Y.mT, Y) if Y.shape[-2] >= Y.shape[-1] else mm(Y, Y.mT)  # (..., k, k)
        G.diagonal(dim1=-2, dim2=-1).sub_(1.0)  # G − I
        return torch.linalg.matrix_norm(G, ord="fro").max()


def random_stiefel(
    d: int, r: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """A Haar-random point of St(d, r): Q of the QR of a d×r Gaussian, columns sign-fixed so diag(R) > 0.

    The sign fix makes the result a deterministic function of the Gaussian (Householder QR leaves
    column signs arbitrary) and the distribution exactly Haar. QR runs in float64.
    """
    if not 0 < r <= d:
        raise ValueError(f"St(d, r) needs 0 < r <= d, got d={d}, r={r}")
    device = generator.device if generator is not None else None
    G = torch.randn(d, r, generator=generator, dtype=torch.float64, device=device)  # (d, r)
    Q, R = torch.linalg.qr(G, mode="reduced")  # (d, r), (r, r)
    signs = torch.sign(torch.diagonal(R))
    signs = torch.where(signs == 0, torch.ones_like(signs), signs)
    return (Q * signs).to(dtype).contiguous()  # LAPACK returns Q column-major


def identity_stiefel(d: int, r: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The first r columns of I_d, a point of St(d, r)."""
    if not 0 < r <= d:
        raise ValueError(f"St(d, r) needs 0 < r <= d, got d={d}, r={r}")
    return torch.eye(d, r, dtype=dtype)
