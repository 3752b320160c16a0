"""The fused boundary maps (slimpar/codecs/fused.py) against the autograd composition they replace.

References: ``x @ A`` and ``c @ A.t() + E[ids] @ P`` differentiated by autograd; float64 ``gradcheck``; under
CPU bf16 autocast, the same expressions run by autocast. Also: P gets no gradient, bad arguments fail, and the
fused backward dispatches fewer ops than the composition's (the point of fusing).
"""

import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from slimpar.codecs.fused import stiefel_down, stiefel_lift
from slimpar.codecs.stiefel import random_stiefel

D, R, V, M = 24, 6, 40, 4


def _inputs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, D, generator=g, dtype=dtype, requires_grad=True)
    c = torch.randn(3, 5, R, generator=g, dtype=dtype, requires_grad=True)
    A = random_stiefel(D, R, g).to(dtype).requires_grad_(True)
    E = torch.randn(V, M, generator=g, dtype=dtype, requires_grad=True)
    P = random_stiefel(D, M, g).to(dtype).t().contiguous()  # (m, d), frozen
    ids = torch.randint(0, V, (3, 5), generator=g)
    ids[0, :3] = 7  # repeated ids: the table gradient must accumulate, not overwrite
    return x, c, A, E, P, ids


def _grads(out, inputs, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, inputs, g)


def test_down_matches_autograd_matmul():
    x, _, A, *_ = _inputs()
    got, ref = stiefel_down(x, A), x @ A
    torch.testing.assert_close(got, ref)
    for a, b in zip(_grads(got, (x, A)), _grads(ref, (x, A)), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("anchor", [False, True])
def test_lift_matches_autograd_composition(anchor):
    _, c, A, E, P, ids = _inputs()
    if anchor:
        got, ref = stiefel_lift(c, A, E, P, ids), c @ A.t() + E[ids] @ P
        inputs = (c, A, E)
    else:
        got, ref = stiefel_lift(c, A), c @ A.t()
        inputs = (c, A)
    torch.testing.assert_close(got, ref)
    for a, b in zip(_grads(got, inputs), _grads(ref, inputs), strict=True):
        torch.testing.assert_close(a, b)


def test_gradcheck_in_float64():
    x, c, A, E, P, ids = _inputs(torch.float64)
    assert torch.autograd.gradcheck(lambda x, A: stiefel_down(x, A), (x, A))
    assert torch.autograd.gradcheck(lambda c, A, E: stiefel_lift(c, A, E, P, ids), (c, A, E))


def test_frozen_basis_gets_no_gradient_and_frozen_inputs_none():
    _, c, A, E, P, ids = _inputs()
    P.requires_grad_(True)
    out = stiefel_lift(c, A.detach(), E, P, ids)
    gc, gE, gP = torch.autograd.grad(out.sum(), (c, E, P), allow_unused=True)
    assert gc is not None and gE is not None and gP is None


def test_autocast_bf16_runs_the_products_as_autocast_does():
    x, c, A, E, P, ids = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        down, down_ref = stiefel_down(x, A), x @ A
        lift, lift_ref = stiefel_lift(c, A, E, P, ids), c @ A.t() + E[ids] @ P
    assert down.dtype == down_ref.dtype == torch.bfloat16
    assert lift.dtype == lift_ref.dtype == torch.bfloat16
    torch.testing.assert_close(down, down_ref)
    torch.testing.assert_close(lift.float(), lift_ref.float(), atol=3e-2, rtol=2e-2)  # addmm vs mm + add in bf16
    gx, gA = _grads(down, (x, A))
    rx, rA = _grads(down_ref, (x, A))
    assert gx.dtype == x.dtype and gA.dtype == A.dtype  # each gradient in its input's dtype
    torch.testing.assert_close(gx, rx, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(gA, rA, atol=5e-2, rtol=2e-2)


def test_lift_needs_table_basis_and_ids_together():
    _, c, A, E, P, ids = _inputs()
    with pytest.raises(ValueError, match="together"):
        stiefel_lift(c, A, E, None, ids)
    with pytest.raises(ValueError, match="together"):
        stiefel_lift(c, A, E, P, None)


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _dispatches(fn) -> int:
    with _Count() as count:
        out = fn()
        out.backward(torch.ones_like(out))
    return count.n


def test_fused_maps_dispatch_fewer_ops_than_the_composition():
    _, c, A, E, P, ids = _inputs()
    fused = _dispatches(lambda: stiefel_lift(c, A, E, P, ids))
    composed = _dispatches(lambda: c @ A.t() + E[ids] @ P)
    assert fused < composed, (fused, composed)


@pytest.mark.parametrize("kind", ["lift", "factorized", "full"])
def test_table_gradient_is_the_same_bits_every_run(kind):
    """A token id repeated thousands of times: its rows must be summed in one order on every run. Indexing's
    backward (index_put_ with accumulate) adds them with atomics over threads and gave a different sum on each of
    20 runs with 2 threads; an embedding's backward sums them in sorted order."""
    from slimpar.codecs.anchors import FactorizedAnchor, FullAnchor

    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 8, (16, 1024), generator=g)  # 16k tokens over 8 ids
    if kind == "lift":
        E, P = torch.randn(8, M, generator=g, requires_grad=True), random_stiefel(D, M, g).t().contiguous()
        forward = functools.partial(stiefel_lift, torch.zeros(16, 1024, R), random_stiefel(D, R, g), E, P, ids)
    else:
        anchor = FactorizedAnchor(8, M, D) if kind == "factorized" else FullAnchor(8, D)
        anchor.E.data.normal_(generator=g)
        E, forward = anchor.E, functools.partial(anchor, ids)
    grad_out = torch.randn(16, 1024, D, generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        sums = {torch.autograd.grad(forward(), E, grad_out)[0].numpy().tobytes() for _ in range(8)}
    finally:
        torch.set_num_threads(threads)
    assert len(sums) == 1


@pytest.mark.parametrize("which", ["down", "lift"])
def test_changing_A_between_forward_and_backward_fails(which):
    """A is held for backward without autograd's saved-tensor machinery (codecs/fused.py, ``_keep``), so the check
    that machinery makes is made by hand: an in-place change of A between the forward and its backward fails."""
    x, c, A, E, P, ids = _inputs()
    out = stiefel_down(x, A) if which == "down" else stiefel_lift(c, A, E, P, ids)
    with torch.no_grad():
        A.mul_(1.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        out.sum().backward()


def test_kept_views_follow_A_P_and_the_ids():
    """The transposes of A and P and the flattened ids are made once and kept; they must show every later value:
    after A changes in place (an optimizer step), after A.data is replaced, and after the ids change in place."""
    x, c, A, E, P, ids = _inputs()
    for step in range(3):
        if step == 1:
            with torch.no_grad():
                A.copy_(random_stiefel(D, R, torch.Generator().manual_seed(9)))
                ids.random_(0, V, generator=torch.Generator().manual_seed(4))
        if step == 2:
            A.data = random_stiefel(D, R, torch.Generator().manual_seed(8))
        lift, down = stiefel_lift(c, A, E, P, ids), stiefel_down(x, A)
        torch.testing.assert_close(lift, c @ A.t() + E[ids] @ P)
        torch.testing.assert_close(down, x @ A)
        got = _grads(lift, (c, A, E)) + _grads(down, (x, A))
        want = _grads(c @ A.t() + E[ids] @ P, (c, A, E)) + _grads(x @ A, (x, A))
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)


def test_kept_views_save_their_dispatches():
    """A second forward and backward with the same A, P and ids dispatches 5 ops fewer than the first, which made
    the kept views: A's and P's transposes (a detach and a transpose each) and the ids' flat view."""
    _, c, A, E, P, ids = _inputs()
    first = _dispatches(lambda: stiefel_lift(c, A, E, P, ids))
    again = _dispatches(lambda: stiefel_lift(c, A, E, P, ids))
    assert first - again == 5, (first, again)


def test_a_fake_tensors_views_are_made_at_every_use():
    """Under a fake-tensor tracer (the stand-in device, memory prediction) A, P and the ids have no storage to key a
    kept view on (reading a fake tensor's data pointer is deprecated): their views are made at each use, nothing is
    kept, and the result has the shape of the real one."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from slimpar.codecs import fused

    with FakeTensorMode():
        _, c, A, E, P, ids = _inputs()
        out = stiefel_lift(c, A, E, P, ids)
        out.sum().backward()
        down = stiefel_down(out, A)
    assert out.shape == (3, 5, D) and down.shape == (3, 5, R) and A.grad.shape == (D, R)
    assert not any(t in fused._VIEWS for t in (A, P, ids))
