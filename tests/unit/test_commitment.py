"""RVQ's commitment loss as one autograd node (slimpar/codecs/commitment.py) against the autograd expression it
replaces: the same value and the same gradient bits, for any β, an upstream gradient other than 1, fp32 and bf16."""

import pytest
import torch

from slimpar.codecs.commitment import commitment_loss


def _reference(x, target, beta):
    return beta * (x.reshape(-1, x.shape[-1]).float() - target).pow(2).sum(-1).mean()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("beta", [0.25, 0.1, 1.7])
def test_value_and_gradient_bits_are_autograd_s(dtype, beta):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 50, 12, generator=g).to(dtype).requires_grad_(True)
    target = torch.randn(150, 12, generator=g)
    upstream = torch.tensor(0.37)
    got, want = commitment_loss(x, target, beta), _reference(x, target, beta)
    assert torch.equal(got, want)
    (gx,) = torch.autograd.grad(got, x, upstream)
    (rx,) = torch.autograd.grad(want, x, upstream)
    assert gx.dtype == dtype and torch.equal(gx, rx)


def test_target_gets_no_gradient():
    x = torch.randn(4, 6, requires_grad=True)
    target = torch.randn(4, 6, requires_grad=True)
    loss = commitment_loss(x, target, 0.25)
    gx, gt = torch.autograd.grad(loss, (x, target), allow_unused=True)
    assert gx is not None and gt is None
