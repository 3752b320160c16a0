"""SPEL's retraction msign(A − ηD) without normalisation (codecs.stiefel.retract) against scipy.linalg.polar.

D is a spectral direction (‖D‖₂ = 1): the polar factor of a random tangent vector, or ±A, which put every
singular value of A − ηD at 1 + η or 1 − η, the ends of the bound ``retraction_steps`` assumes.
Tolerances: |Q − polar(X)| ≤ 2e-6 entrywise and ‖QᵀQ − I‖_F ≤ 1e-5 (measured at most 1.4e-7 and 1.8e-6; the
normalised 10-step Polar Express on the same inputs is 2.1e-6 from polar(X)).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

from slimpar.codecs.stiefel import (
    DEFAULT_POLAR_STEPS,
    RETRACT_FLOOR,
    RETRACT_MARGIN,
    polar_eigh,
    polar_express,
    random_stiefel,
    retract,
    retraction_steps,
)

ETAS = [1e-3, 1e-2, 0.1, 0.3]


def _directions(A: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """Spectral directions at A: a random tangent vector's polar factor (float64), −A and A."""
    G = np.random.default_rng(seed).standard_normal(A.shape)
    S = A.T @ G
    xi = G - A @ ((S + S.T) / 2)
    return {"tangent": scipy.linalg.polar(xi)[0], "stretch": -A, "shrink": A}


@pytest.mark.parametrize("shape", [(256, 64), (64, 16)])
@pytest.mark.parametrize("eta", ETAS)
def test_retract_matches_scipy_polar(shape: tuple[int, int], eta: float) -> None:
    A = random_stiefel(*shape, torch.Generator().manual_seed(0)).double().numpy()
    for name, D in _directions(A, seed=1).items():
        X = (A - eta * D).astype(np.float32)
        ref = scipy.linalg.polar(X.astype(np.float64))[0]
        Q = retract(torch.from_numpy(X), eta).double().numpy()
        assert np.abs(Q - ref).max() <= 2e-6, (name, np.abs(Q - ref).max())
        assert np.linalg.norm(Q.T @ Q - np.eye(shape[1])) <= 1e-5, name


def test_batched_retract_is_each_alone() -> None:
    g = torch.Generator().manual_seed(2)
    X = torch.stack([random_stiefel(48, 12, g) - 0.01 * random_stiefel(48, 12, g) for _ in range(3)])
    batched = retract(X, 0.01)
    for i in range(3):
        torch.testing.assert_close(batched[i], retract(X[i], 0.01), atol=1e-6, rtol=0)


def _final_row(x: np.ndarray) -> np.ndarray:
    return (15 * x - 10 * x**3 + 3 * x**5) / 8


@pytest.mark.parametrize("eta", [0.0, *ETAS, 0.45])
def test_step_count_is_the_fewest_that_reach_the_floor(eta: float) -> None:
    """Independently: the scalar map applied k times takes every σ in [1 − δ, 1 + δ] to within the floor of 1,
    and k − 1 times does not (δ = η + margin)."""
    k = retraction_steps(eta)
    assert k is not None
    delta = eta + RETRACT_MARGIN
    x = np.linspace(1 - delta, 1 + delta, 20001)
    for _ in range(k - 1):
        x = _final_row(x)
    if k > 1:
        assert np.abs(x - 1).max() > RETRACT_FLOOR
    assert np.abs(_final_row(x) - 1).max() <= RETRACT_FLOOR


def test_one_step_at_the_default_eta() -> None:
    """By hand: δ = 1.1e-3, p(1 ± δ) − 1 ≈ ±2.5 δ³ = 3.3e-9, below the 1e-7 floor after one step."""
    assert retraction_steps(1e-3) == 1


def test_far_inputs_fall_back_to_polar_express() -> None:
    """Past the bound the normalised iteration runs unchanged; eigh stays exact; a tensor η is not read."""
    g = torch.Generator().manual_seed(3)
    X = random_stiefel(40, 10, g) - 0.6 * random_stiefel(40, 10, g)
    assert retraction_steps(0.6) is None
    assert retraction_steps(0.2, max_steps=3) is None  # needs 3: not fewer than the full iteration's 3
    assert torch.equal(retract(X, 0.6), polar_express(X, DEFAULT_POLAR_STEPS))
    assert torch.equal(retract(X, 0.01, backend="eigh"), polar_eigh(X))
    assert torch.equal(retract(X, torch.tensor(0.01)), polar_express(X, DEFAULT_POLAR_STEPS))
