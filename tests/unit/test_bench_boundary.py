"""The throughput bench's ``MAPL boundary step`` row does a boundary's whole work: checked against plain autograd on
the unfused products, scipy's exact polar factors for SPEL and torch's AdamW for the anchor table."""

import numpy as np
import scipy.linalg
import torch

from benchmarks.boundary import BoundaryStep, boundary_row
from slimpar.codec_defaults import CODEC_DEFAULTS

D, V, B, T = 32, 50, 2, 8


def _polar(x: np.ndarray) -> np.ndarray:
    return scipy.linalg.polar(x)[0]  # (d, r) with orthonormal columns


def test_one_boundary_step_is_the_reference_step():
    step = BoundaryStep.build(D, V, B, T, torch.device("cpu"), seed=3)
    enc, dec = step.encoder, step.decoder
    A0, E0 = enc.projector.A.detach().clone(), dec.anchor.E.detach().clone()
    P, ids, h, g = dec.anchor.P, enc.context.ids[0], step.h.detach(), step.grad_out
    assert dec.projector.A is enc.projector.A and A0.shape == (D, D // 4)

    A, E, x = A0.clone().requires_grad_(), E0.clone().requires_grad_(), h.clone().requires_grad_()
    lifted = (x @ A) @ A.t() + E[ids] @ P  # ĥ = A Aᵀh + E[t]P, unfused, every product recorded by autograd
    lifted.backward(g)
    grad_h = step.step()
    torch.testing.assert_close(grad_h, x.grad, rtol=1e-5, atol=1e-5)

    # SPEL from a zero momentum, in float64 with exact polar factors: M = (1 − β)G, ξ = M − A sym(AᵀM)
    spel = CODEC_DEFAULTS.spel
    a, grad = A0.double().numpy(), A.grad.double().numpy()
    m = (1 - spel.momentum) * grad
    w = a.T @ m
    xi = m - a @ (0.5 * (w + w.T))
    want = _polar(a - spel.lr * _polar(xi))
    np.testing.assert_allclose(enc.projector.A.detach().double().numpy(), want, atol=2e-6)
    assert np.linalg.norm(want - a) > 1e-4  # A moved: the check above is not A0 against itself

    E_ref = E0.clone().requires_grad_()
    E_ref.grad = E.grad
    torch.optim.AdamW([E_ref], lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1).step()
    torch.testing.assert_close(dec.anchor.E.detach(), E_ref.detach(), rtol=0, atol=1e-7)
    assert not torch.equal(dec.anchor.E, E0)


def test_the_row_counts_one_step_and_never_waits_for_the_host():
    row = boundary_row("tiny", 512, 4, 32, warmup=1, steps=2, device=torch.device("cpu"))
    assert row["dim"] == 64 and row["rank"] == 16
    assert row["step_time_s"] > row["spel_time_s"] > 0
    assert row["aten_ops"] > 50 and row["host_syncs"] == 0 and row["peak_mem_bytes"] is None


def test_the_step_keeps_to_its_device():
    """On the stand-in accelerator (tests/standin_device.py) an operator mixing a host tensor with the device's
    fails, as it would on a GPU: the halves, ids, h and the optimizer's state all live on the device."""
    from tests.standin_device import DEVICE, standin_accelerator

    with standin_accelerator(0, 1):
        step = BoundaryStep.build(D, V, B, T, DEVICE)
        for _ in range(2):
            assert step.step().device == DEVICE
        state = step.optimizer.state[step.encoder.projector.A]
        assert step.encoder.projector.A.device == state["momentum"].device == DEVICE
