"""RVQ's commitment loss β · mean_tokens ‖x − x̂‖² with x̂ held fixed, as one autograd node.

    forward:   d = x − x̂ (fp32, rows of tokens),  L = β · (1/N) Σ_i Σ_j d_ij²
    backward:  ∂L/∂x = ((g · β) / N) · (2 d)      (x̂ gets no gradient)

Why by hand: autograd records the difference, square, sum, mean and scale as five nodes, and their backward as
about ten dispatcher calls (expansions, a copy of d, three products) a boundary. This node makes the same products
in the same order, so its gradient has the same bits as autograd's: g·β, then ÷N, then that times 2d (doubling is
exact). No communication.
"""

from __future__ import annotations

import torch
from torch import Tensor


class _Commitment(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, target: Tensor, beta: float) -> Tensor:
        d = x.reshape(-1, x.shape[-1]).float() - target  # (N, D)
        ctx.save_for_backward(d)
        ctx.beta, ctx.shape, ctx.dtype = beta, x.shape, x.dtype
        return beta * d.pow(2).sum(-1).mean()

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, None, None]:
        (d,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        scale = g * ctx.beta / d.shape[0]  # autograd's order: the scale's product, then the mean's division
        return (scale * (2 * d)).view(ctx.shape).to(ctx.dtype), None, None


def commitment_loss(x: Tensor, target: Tensor, beta: float) -> Tensor:
    """β · mean over tokens of ‖x − target‖² (x (..., D), target (N, D) float32, N the tokens of x), its gradient to
    x only; equal to ``beta * (x.reshape(-1, D).float() - target).pow(2).sum(-1).mean()`` bit for bit, with its
    gradient."""
    return _Commitment.apply(x, target.detach(), beta)
