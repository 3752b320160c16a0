"""Stiefel math against independent references: scipy.linalg.polar, numpy SVD, scipy null spaces.

Tolerances (max-abs entrywise unless stated; measured maxima over the cases in brackets, CPU):
- polar_express, fp32, κ ≤ 1e3: ‖QᵀQ − I‖_F ≤ 1e-5 [9.5e-7]; |Q − U_polar| ≤ 2e-5 [4.3e-6].
- polar_eigh on fp32 input: ‖QᵀQ − I‖_F ≤ 1e-6 [2.2e-7]; |Q − U_polar| ≤ 1e-6 [2.2e-8].
- polar_eigh on float64 input: |Q − U_polar| ≤ 1e-12·κ [1.8e-14·κ].
The reference is the polar factor of the *same* (fp32-rounded) matrix, computed in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from slimpar.codecs.stiefel import (
    DEFAULT_POLAR_STEPS,
    DIRECTION_STEPS,
    PolarWork,
    identity_stiefel,
    msign,
    orth_error,
    polar_eigh,
    polar_express,
    polar_express_coefficients,
    random_stiefel,
    retract,
    tangent_project,
)

SHAPES = [(64, 8), (128, 32), (32, 32), (8, 64)]
KAPPAS = [1.0, 1e2, 1e3]


def _matrix(m: int, n: int, kappa: float, seed: int = 0) -> np.ndarray:
    """fp32-representable m×n matrix with singular values geometrically spaced in [1/κ, 1]."""
    rng = np.random.default_rng(seed)
    k = min(m, n)
    U, _ = np.linalg.qr(rng.standard_normal((m, k)))
    V, _ = np.linalg.qr(rng.standard_normal((n, k)))
    X = U @ np.diag(np.geomspace(1.0, 1.0 / kappa, k)) @ V.T
    return X.astype(np.float32).astype(np.float64)


def _np_orth(Q: np.ndarray) -> float:
    G = Q.T @ Q if Q.shape[0] >= Q.shape[1] else Q @ Q.T
    return float(np.linalg.norm(G - np.eye(G.shape[0])))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kappa", KAPPAS)
def test_polar_express_matches_scipy_polar(shape: tuple[int, int], kappa: float) -> None:
    X = _matrix(*shape, kappa)
    ref = scipy.linalg.polar(X)[0]  # (m, n), orthonormal columns (or rows when wide)
    Q = polar_express(torch.from_numpy(X))
    assert Q.dtype == torch.float32 and Q.shape == shape
    Qn = Q.double().numpy()
    assert _np_orth(Qn) <= 1e-5
    assert np.abs(Qn - ref).max() <= 2e-5


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kappa", KAPPAS)
def test_polar_eigh_matches_svd(shape: tuple[int, int], kappa: float) -> None:
    X = _matrix(*shape, kappa)
    U, _, Vt = np.linalg.svd(X, full_matrices=False)
    ref = U @ Vt
    Q64 = polar_eigh(torch.from_numpy(X))
    assert Q64.dtype == torch.float64
    assert np.abs(Q64.numpy() - ref).max() <= 1e-12 * kappa
    Q32 = polar_eigh(torch.from_numpy(X).float())
    assert Q32.dtype == torch.float32
    assert _np_orth(Q32.double().numpy()) <= 1e-6
    assert np.abs(Q32.double().numpy() - ref).max() <= 1e-6


def test_msign_dispatch_and_batch() -> None:
    X = np.stack([_matrix(48, 12, 10.0, seed=s) for s in range(3)])  # (3, 48, 12)
    Xt = torch.from_numpy(X)
    batched = msign(Xt, backend="polar_express")
    exact = msign(Xt, backend="eigh")
    for i in range(3):
        ref = scipy.linalg.polar(X[i])[0]
        assert np.abs(batched[i].double().numpy() - ref).max() <= 2e-5
        assert np.abs(exact[i].numpy() - ref).max() <= 1e-12
    assert orth_error(batched) <= 1e-5
    with pytest.raises(ValueError):
        msign(Xt, backend="newton_schulz")


def test_polar_express_scalar_map_reaches_one() -> None:
    """Composed scalar polynomials, evaluated independently in float64 numpy, send [1e-3, 1]/1.01 to 1."""
    sigma = np.geomspace(1e-3, 1.0, 2001) / 1.01
    x = sigma.copy()
    for a, b, c in polar_express_coefficients(DEFAULT_POLAR_STEPS):
        x = a * x + b * x**3 + c * x**5
    assert np.abs(x - 1.0).max() <= 1e-9
    rows = polar_express_coefficients(9)
    assert rows[0] == pytest.approx(
        (8.28721201814563 / 1.01, -23.595886519098837 / 1.01**3, 17.300387312530933 / 1.01**5), rel=1e-15
    )
    assert rows[7] == rows[8] == (1.875, -1.25, 0.375)


def test_direction_steps_take_the_table_range_to_one() -> None:
    """SPEL's D with DIRECTION_STEPS (the 7 table rows): every singular value of ξ of at least 1e-3·‖ξ‖_F goes to
    1 within 1.1e-5, the smaller ones stay in [0, 1]; measured as diag(Uᵀ D V) with numpy's SVD of the same ξ."""
    m, n = 96, 24
    rng = np.random.default_rng(5)
    U, _ = np.linalg.qr(rng.standard_normal((m, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    X = ((U * np.geomspace(1.0, 1e-5, n)) @ V.T).astype(np.float32).astype(np.float64)
    Us, s, Vt = np.linalg.svd(X, full_matrices=False)
    D = polar_express(torch.from_numpy(X), DIRECTION_STEPS).double().numpy()
    sigma = np.einsum("mi,mn,in->i", Us, D, Vt)  # D's value along each singular pair of ξ
    big = s >= 1e-3 * np.linalg.norm(X)
    assert 0 < big.sum() < n
    assert np.abs(sigma[big] - 1).max() <= 1.1e-5 + 1e-6  # + fp32 rounding of the iteration
    assert sigma[~big].min() >= -1e-5 and sigma.max() <= 1 + 1e-6
    assert DIRECTION_STEPS == 7 < DEFAULT_POLAR_STEPS


class _Ops(TorchDispatchMode):
    """The aten ops dispatched inside, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("shape", [(48, 12), (12, 48), (3, 48, 12), (3, 12, 48)])
def test_polar_work_iterates_bit_for_bit(shape: tuple[int, ...]) -> None:
    """Iterating in a PolarWork's two buffers gives the plain iteration's bits, normalised or not (the retraction),
    with one transpose in all (the buffers' views) where the plain iteration transposes at every step."""
    X = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    with _Ops() as plain:
        ref = polar_express(X, DIRECTION_STEPS)
    with _Ops() as kept:
        work = PolarWork(X)
        D = polar_express(X, DIRECTION_STEPS, work=work)
    assert torch.equal(D, ref) and work.holds(D)
    assert (plain.names.count("transpose"), kept.names.count("transpose")) == (DIRECTION_STEPS, 1)
    Y = torch.add(msign(X), D, alpha=-1e-3, out=work.other(D))  # a retraction's input, in the other buffer
    want, far = retract(Y.clone(), 1e-3), retract(Y.clone(), 0.6)
    assert torch.equal(retract(Y, 1e-3, work=work), want)  # overwrites D's buffer
    assert torch.equal(retract(Y.clone(), 0.6, work=work), far)  # not held in the work: the plain path
    other = PolarWork(torch.empty(2, *shape))  # another shape: the plain path, not a resized buffer
    assert torch.equal(polar_express(X, DIRECTION_STEPS, work=other), ref) and not other.holds(ref)


def test_rank_deficient_maps_null_space_to_zero() -> None:
    """A 5×5 skew matrix has rank 4; msign(X) = U₄V₄ᵀ (sign(0) = 0), as the SVD gives."""
    rng = np.random.default_rng(3)
    B = rng.standard_normal((5, 5))
    X = B - B.T
    U, s, Vt = np.linalg.svd(X)
    assert s[-1] < 1e-12 * s[0]
    ref = U[:, :4] @ Vt[:4]
    assert np.abs(polar_eigh(torch.from_numpy(X)).numpy() - ref).max() <= 1e-10
    # In fp32 the null singular value becomes rounding noise (~1e-7·σ₁), which the iteration amplifies
    # by up to p'(0) = ∏ a_t ≈ 2e4 (measured error 1.7e-5): hence the looser tolerance.
    assert np.abs(polar_express(torch.from_numpy(X)).double().numpy() - ref).max() <= 1e-4


def test_zero_matrix_stays_zero() -> None:
    Z = torch.zeros(16, 4)
    assert torch.equal(polar_express(Z), Z)
    assert torch.equal(polar_eigh(Z), Z)


def test_tangent_project_matches_null_space_projection() -> None:
    """Reference: the orthogonal projection of vec(M) onto the null space of Ξ ↦ AᵀΞ + ΞᵀA (scipy)."""
    d, r = 7, 3
    gen = torch.Generator().manual_seed(0)
    A = random_stiefel(d, r, gen, dtype=torch.float64)
    M = torch.randn(d, r, generator=gen, dtype=torch.float64)
    An = A.numpy()
    L = np.zeros((r * r, d * r))
    for j in range(d * r):
        E = np.zeros(d * r)
        E[j] = 1.0
        E = E.reshape(d, r)
        L[:, j] = (An.T @ E + E.T @ An).ravel()
    N = scipy.linalg.null_space(L)  # (d r, dim T)
    assert N.shape[1] == d * r - r * (r + 1) // 2
    ref = (N @ (N.T @ M.numpy().ravel())).reshape(d, r)
    Xi = tangent_project(A, M)
    assert np.abs(Xi.numpy() - ref).max() <= 1e-12
    sym_part = A.T @ Xi + Xi.T @ A
    assert sym_part.abs().max() <= 1e-12
    assert (tangent_project(A, Xi) - Xi).abs().max() <= 1e-12


def test_tangent_project_fp32_idempotent() -> None:
    gen = torch.Generator().manual_seed(1)
    A = random_stiefel(64, 16, gen)
    Xi = tangent_project(A, torch.randn(64, 16, generator=gen))
    assert (A.T @ Xi + Xi.T @ A).abs().max() <= 1e-5
    assert (tangent_project(A, Xi) - Xi).abs().max() <= 1e-5


def test_orth_error_hand_computed() -> None:
    delta = 1e-3
    A = identity_stiefel(5, 2, dtype=torch.float64) * (1 + delta)
    expected = np.sqrt(2.0) * ((1 + delta) ** 2 - 1)  # AᵀA − I = ((1+δ)² − 1) I₂
    assert orth_error(A) == pytest.approx(expected, rel=1e-12)
    assert orth_error(identity_stiefel(5, 2)) == 0.0
    assert np.array_equal(identity_stiefel(5, 2).numpy(), np.eye(5, 2, dtype=np.float32))


def test_random_stiefel_is_sign_fixed_qr() -> None:
    d, r = 40, 6
    A = random_stiefel(d, r, torch.Generator().manual_seed(7))
    G = torch.randn(d, r, generator=torch.Generator().manual_seed(7), dtype=torch.float64).numpy()
    Q, R = np.linalg.qr(G)
    ref = Q * np.sign(np.diag(R))
    assert A.dtype == torch.float32 and A.shape == (d, r)
    assert np.abs(A.double().numpy() - ref).max() <= 1e-6
    assert orth_error(A) <= 1e-6
    assert torch.equal(A, random_stiefel(d, r, torch.Generator().manual_seed(7)))
    with pytest.raises(ValueError):
        random_stiefel(4, 5)
