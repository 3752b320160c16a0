"""Boundary-tensor casts used as compression baselines: bf16 and symmetric per-row int8.

``Bf16Codec``: payload = x rounded to bfloat16 (round-to-nearest-even), 2 bytes/element. Error bound
for normal values: |x̂ − x| <= 2**-8 |x| (8 significand bits, unit roundoff 2**-8).

``Int8Codec``: per row of the last dimension (per token), s = max|x_row| / 127 is rounded to the scale
dtype (fp32 by default, or bf16); q = clamp(round(x / s), −127, 127) as int8; x̂ = q · s. The encoder
quantizes with the *rounded* scale the receiver will see, so both ends agree; an all-zero row gets
s = 0 and q = 0. Payload = numel bytes + rows · sizeof(scale). Error bound: |x̂ − x| <= s / 2 per
element (for a bf16 scale |x|/s <= 127 / (1 − 2**-8) < 127.5, so the clamp never bites).

Both codecs are stateless ``nn.Module``s: ``encode`` / ``decode`` give the wire payload, ``forward``
is the fake-quantized tensor with a straight-through gradient (identity in backward), the form used
inside autograd in a single-process pipeline simulation.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

INT8_MAX = 127
_TINY = 2.0**-149  # the least positive (subnormal) float32


class _StraightThrough(torch.autograd.Function):
    """Forward returns ``value`` bit-exactly; backward passes the gradient to ``x`` unchanged."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        ctx.x_dtype = x.dtype
        return value.to(x.dtype).clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.to(ctx.x_dtype), None


def straight_through(x: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` in forward, identity gradient to ``x`` in backward.

    Same gradient as ``x + (value − x).detach()`` but the forward result equals ``value`` exactly
    (the additive form rounds), which keeps sender and receiver decodes bit-identical.
    """
    return _StraightThrough.apply(x, value.detach())


class Int8Payload(NamedTuple):
    """What ``Int8Codec`` puts on the wire: int8 values (..., D) and one scale per row (..., 1)."""

    values: torch.Tensor
    scale: torch.Tensor

    def nbytes(self) -> int:
        return (
            self.values.numel() * self.values.element_size() + self.scale.numel() * self.scale.element_size()
        )


class Bf16Codec(nn.Module):
    """Cast to bfloat16 on the wire (2 bytes/element)."""

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)

    def decode(self, payload: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return payload.to(dtype)

    @staticmethod
    def payload_nbytes(shape: tuple[int, ...] | torch.Size) -> int:
        return 2 * math.prod(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fake_bf16(x)


class Int8Codec(nn.Module):
    """Symmetric per-row absmax int8 (rows = all but the last dimension), one scale per row."""

    def __init__(self, scale_dtype: torch.dtype = torch.float32):
        super().__init__()
        if scale_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"scale_dtype must be float32 or bfloat16, got {scale_dtype}")
        self.scale_dtype = scale_dtype

    def encode(self, x: torch.Tensor) -> Int8Payload:
        xf = x.float()  # (..., D)
        absmax = torch.linalg.vector_norm(xf, ord=math.inf, dim=-1, keepdim=True)  # max |x| per row, one kernel
        scale = (absmax / INT8_MAX).to(self.scale_dtype)  # (..., 1)
        # a row whose scale is 0 divides by the least positive float32 (every other scale is at least that, so
        # unchanged): it decodes to 0 whatever its values (an all-zero row sends 0s); a NaN scale stays NaN
        safe = scale.float().clamp_min(_TINY)
        q = torch.round(xf / safe).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)  # (..., D)
        return Int8Payload(q, scale)

    def decode(self, payload: Int8Payload, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (payload.values.float() * payload.scale.float()).to(dtype)

    def payload_nbytes(self, shape: tuple[int, ...] | torch.Size) -> int:
        rows = math.prod(shape[:-1])
        scale_bytes = torch.empty((), dtype=self.scale_dtype).element_size()
        return math.prod(shape) + rows * scale_bytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return straight_through(x, self.decode(self.encode(x.detach()), x.dtype))


def fake_bf16(x: torch.Tensor) -> torch.Tensor:
    """x rounded through bfloat16, in x's dtype, with an identity gradient."""
    return straight_through(x, x.detach().to(torch.bfloat16).to(x.dtype))


def fake_quant_int8(x: torch.Tensor, scale_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x through per-row int8 encode/decode, in x's dtype, with an identity gradient."""
    return Int8Codec(scale_dtype)(x)
