"""SPELAdamW: manifold invariant, optimisation quality, AdamW parity, determinism, state round trip.

References: numpy/scipy (SVD and scipy.linalg.polar for one SPEL step, numpy.linalg.eigh for the
Ky Fan maximum of tr(AᵀCA)) and torch.optim.AdamW for the AdamW half.
"""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import scipy.linalg
import torch
from torch import nn

from slimpar.codecs.stiefel import random_stiefel
from slimpar.optim.spel import SPELAdamW, spel_step, spel_steps

BACKENDS = ["polar_express", "eigh"]


def _stiefel_param(d: int, r: int, seed: int) -> nn.Parameter:
    return nn.Parameter(random_stiefel(d, r, torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_orthogonality_over_1000_steps(backend: str) -> None:
    """Random gradients, large steps (η = 0.2): ‖AᵀA − I‖_F stays ≤ 1e-5 at every step."""
    A = _stiefel_param(64, 16, seed=0)
    opt = SPELAdamW([{"params": [A], "manifold": "stiefel", "backend": backend}], lr=0.2, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    for _ in range(1000):
        A.grad = torch.randn(64, 16, generator=gen)
        opt.step()
        worst = max(worst, opt.last_orth_error)
    An = A.detach().double().numpy()
    assert worst <= 1e-5
    assert np.linalg.norm(An.T @ An - np.eye(16)) <= 1e-5  # independent recomputation
    assert opt.last_spel_seconds > 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_maximises_trace_objective(backend: str) -> None:
    """max tr(AᵀCA) over St(d, r) is the sum of the r largest eigenvalues of C (Ky Fan)."""
    d, r = 32, 4
    Q = random_stiefel(d, d, torch.Generator().manual_seed(0))
    lam = torch.cat([torch.linspace(0.0, 1.0, d - r), torch.tensor([2.5, 3.0, 3.5, 4.0])])
    C = Q @ torch.diag(lam) @ Q.T
    C = (C + C.T) / 2  # (d, d)
    evals, evecs = np.linalg.eigh(C.double().numpy())
    best = evals[-r:].sum()
    A = _stiefel_param(d, r, seed=1)
    opt = SPELAdamW([{"params": [A], "manifold": "stiefel", "backend": backend}], lr=0.2, momentum=0.9)
    start = torch.trace(A.T @ C @ A).item()
    for t in range(150):
        opt.param_groups[0]["lr"] = 0.2 * 0.97**t
        opt.zero_grad()
        loss = -torch.trace(A.T @ C @ A)
        loss.backward()
        opt.step()
    value = torch.trace(A.T @ C @ A).item()
    assert start < 0.5 * best
    assert abs(value - best) <= 1e-4 * best
    An = A.detach().double().numpy()
    V = evecs[:, -r:]
    assert np.linalg.norm(An @ An.T - V @ V.T) <= 1e-2  # same subspace as the top eigenvectors


def test_single_step_matches_numpy_reference() -> None:
    """One step from zero momentum, against SVD (for msign ξ) and scipy.linalg.polar (retraction)."""
    d, r, lr, beta = 20, 5, 0.3, 0.9
    A = random_stiefel(d, r, torch.Generator().manual_seed(2))
    G = torch.randn(d, r, generator=torch.Generator().manual_seed(3))
    An, Gn = A.double().numpy(), G.double().numpy()
    Mn = (1 - beta) * Gn
    S = An.T @ Mn
    xi = Mn - An @ ((S + S.T) / 2)
    U, _, Vt = np.linalg.svd(xi, full_matrices=False)
    ref = scipy.linalg.polar(An - lr * (U @ Vt))[0]
    for backend, tol in [("eigh", 1e-5), ("polar_express", 2e-5)]:
        A_new, buf = A.clone(), torch.zeros(d, r)
        spel_step(A_new, G, buf, lr=lr, beta=beta, backend=backend)
        assert np.abs(A_new.double().numpy() - ref).max() <= tol
        assert np.allclose(buf.double().numpy(), Mn, atol=1e-7)


def test_normal_gradient_skips_update() -> None:
    """G = A S with S symmetric is normal to the manifold: ξ = 0, so A must not move."""
    A = _stiefel_param(16, 4, seed=4)
    S = torch.randn(4, 4, generator=torch.Generator().manual_seed(5))
    A.grad = A.detach() @ (S + S.T)
    before = A.detach().clone()
    opt = SPELAdamW([{"params": [A], "manifold": "stiefel", "backend": "eigh"}], lr=0.1, momentum=0.5)
    opt.step()
    assert torch.equal(A.detach(), before)
    assert torch.allclose(opt.state[A]["momentum"], 0.5 * A.grad)


def _mixed_model(seed: int) -> tuple[nn.Linear, nn.Parameter]:
    torch.manual_seed(seed)
    return nn.Linear(12, 6), _stiefel_param(12, 3, seed)


def _mixed_groups(lin: nn.Linear, A: nn.Parameter, backend: str = "polar_express") -> list[dict]:
    return [
        {"params": [lin.weight], "lr": 3e-3, "weight_decay": 0.1},
        {"params": [lin.bias], "weight_decay": 0.0},
        {"params": [A], "manifold": "stiefel", "lr": 0.05, "momentum": 0.8, "backend": backend},
    ]


def _loss(lin: nn.Linear, A: nn.Parameter, x: torch.Tensor) -> torch.Tensor:
    return (lin(x @ A @ A.T) ** 2).mean()


def test_adamw_half_matches_torch_adamw() -> None:
    lin, A = _mixed_model(0)
    ref_lin = copy.deepcopy(lin)
    kw = dict(lr=1e-3, betas=(0.8, 0.95), eps=1e-6)
    opt = SPELAdamW(_mixed_groups(lin, A), weight_decay=0.05, **kw)
    ref = torch.optim.AdamW(
        [
            {"params": [ref_lin.weight], "lr": 3e-3, "weight_decay": 0.1},
            {"params": [ref_lin.bias], "weight_decay": 0.0},
        ],
        weight_decay=0.05,
        **kw,
    )
    gen = torch.Generator().manual_seed(6)
    for _ in range(10):
        x = torch.randn(8, 12, generator=gen)
        opt.zero_grad()
        ref.zero_grad()
        _loss(lin, A, x).backward()
        _loss(ref_lin, A.detach(), x).backward()
        opt.step()
        ref.step()
    for p, q in zip(lin.parameters(), ref_lin.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6, rtol=0)
    assert opt.last_orth_error <= 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_identical_gradients_give_bit_identical_updates(backend: str) -> None:
    """Two 'ranks' holding the same A and fed the same gradients stay bitwise equal."""
    A1, A2 = _stiefel_param(48, 8, seed=7), _stiefel_param(48, 8, seed=7)
    groups = lambda A: [{"params": [A], "manifold": "stiefel", "backend": backend}]  # noqa: E731
    opt1, opt2 = SPELAdamW(groups(A1), lr=0.1), SPELAdamW(groups(A2), lr=0.1)
    # The pure function, applied directly to column-major copies: layout must not change the bits.
    A3, buf3 = A1.detach().T.contiguous().T, torch.zeros(8, 48).T
    gen = torch.Generator().manual_seed(8)
    for _ in range(20):
        G = torch.randn(48, 8, generator=gen)
        A1.grad, A2.grad = G.clone(), G.clone()
        opt1.step()
        opt2.step()
        spel_step(A3, G, buf3, lr=0.1, beta=0.95, backend=backend)
    assert not A3.is_contiguous()
    assert torch.equal(A1, A2)
    assert torch.equal(A1.detach(), A3)


def test_state_dict_round_trip() -> None:
    lin, A = _mixed_model(1)
    lin2, A2 = _mixed_model(1)
    opt = SPELAdamW(_mixed_groups(lin, A, "eigh"), lr=1e-3)
    gen = torch.Generator().manual_seed(9)
    xs = [torch.randn(8, 12, generator=gen) for _ in range(6)]
    for x in xs[:3]:
        opt.zero_grad()
        _loss(lin, A, x).backward()
        opt.step()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    with torch.no_grad():
        for p, q in zip([*lin.parameters(), A], [*lin2.parameters(), A2], strict=True):
            q.copy_(p)
    opt2 = SPELAdamW(_mixed_groups(lin2, A2, "polar_express"), lr=1e-3)
    opt2.load_state_dict(torch.load(buffer, weights_only=True))
    assert opt2.param_groups[2]["backend"] == "eigh" and opt2.param_groups[2]["manifold"] == "stiefel"
    assert torch.equal(opt2.state[A2]["momentum"], opt.state[A]["momentum"])
    for x in xs[3:]:
        for o, m, a in [(opt, lin, A), (opt2, lin2, A2)]:
            o.zero_grad()
            _loss(m, a, x).backward()
            o.step()
    for p, q in zip([*lin.parameters(), A], [*lin2.parameters(), A2], strict=True):
        assert torch.equal(p, q)


def test_rejects_bad_groups() -> None:
    wide = nn.Parameter(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="d >= r"):
        SPELAdamW([{"params": [wide], "manifold": "stiefel"}])
    with pytest.raises(ValueError, match="backend"):
        SPELAdamW([{"params": [_stiefel_param(8, 2, 0)], "manifold": "stiefel", "backend": "qr"}])
    with pytest.raises(ValueError, match="manifold"):
        SPELAdamW([{"params": [_stiefel_param(8, 2, 0)], "manifold": "sphere"}])


@pytest.mark.parametrize("backend", ["polar_express", "eigh"])
def test_batched_spel_equals_one_by_one(backend: str) -> None:
    """spel_steps on a batch of n A's (two of them copies with the same gradients, as a virtual pipeline's two
    ends of a boundary) is spel_step on each, to rounding; the copies stay bitwise equal."""
    g = torch.Generator().manual_seed(3)
    As = [random_stiefel(48, 12, g) for _ in range(3)]
    As.append(As[0].clone())
    grads = [[torch.randn(48, 12, generator=g) for _ in range(4)] for _ in range(3)]
    for step in grads:
        step[3] = step[0].clone()
    alone, batch = [a.clone() for a in As], [a.clone() for a in As]
    bufs_alone, bufs_batch = [torch.zeros(48, 12) for _ in As], [torch.zeros(48, 12) for _ in As]
    for step in grads:
        for A, G, buf in zip(alone, step, bufs_alone, strict=True):
            spel_step(A, G, buf, 0.05, 0.9, backend)
        spel_steps(batch, step, bufs_batch, 0.05, 0.9, backend)
    for a, b in zip(alone, batch, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
        assert torch.linalg.matrix_norm(b.T @ b - torch.eye(12)) < 1e-5
    assert torch.equal(batch[0], batch[3])
    assert not torch.allclose(batch[0], As[0], atol=1e-3)  # A moved


def test_batched_group_steps_like_the_unbatched_one() -> None:
    g = torch.Generator().manual_seed(4)
    params = [nn.Parameter(random_stiefel(32, 8, g)) for _ in range(2)] + [nn.Parameter(random_stiefel(32, 4, g))]
    twins = [nn.Parameter(p.detach().clone()) for p in params]
    opts = [SPELAdamW([{"params": ps, "manifold": "stiefel", "lr": 0.02, "batched": batched}])
            for ps, batched in ((params, True), (twins, False))]
    for _ in range(3):
        for p, q in zip(params, twins, strict=True):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        for opt in opts:
            opt.step()
    for p, q in zip(params, twins, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), atol=1e-5, rtol=0)
    assert opts[0].last_orth_error == pytest.approx(opts[1].last_orth_error, abs=1e-6)
