"""Codec kinds: what each ``pipeline.codec`` name means, in one table (``CODEC_KINDS``).

A boundary codec is (optional anchors) → (optional projector d → r) → (optional RVQ) → a wire cast of
the float tensor that crosses. Anchors and RVQ are options of every projecting kind; the kind fixes
the rest, and every place that used to switch on the name reads it from here:

  kind    projector (d → r)               wire cast (forward and backward)   other traits
  none    —                               fp32
  bf16    —                               bf16
  int8    —                               int8 + fp32 scale per token
  mapl    StiefelProjector (learned A)    fp32                               A on St(d, r): SPEL, PCA start, shared
  ssn     FixedSubspace (frozen U)        fp32                               fixed token table, model in span(U)
  naive   NaiveProjector (learned pair)   fp32

Each row is a ``CodecKind`` registered in ``codec_registry.CODEC_KINDS``, which declares everything a codec is:
its projector, its cast, its traits, its own typed settings (``pipeline.codec_options``), their check and its bytes
per token. A new codec is its math in one module of slimpar/codecs/ (as quant.py is int8's) and one entry below
(its cast over that math, its settings and its ``CodecKind``); a codec of a user's own registers the same way
from outside slimpar (docs/pipeline.md, "Adding a codec").
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from slimpar.codecs.projector import FixedSubspace, NaiveProjector, StiefelProjector
from slimpar.codecs.quant import Int8Codec, Int8Payload, fake_bf16, straight_through
from slimpar.pipeline.codec_registry import (  # noqa: F401 - the registry's names are this table's too
    CODEC_KINDS,
    CodecKind,
    ProjectorBuilder,
    codec_kind,
    codec_settings,
    names,
    register_codec,
    unregister_codec,
)
from slimpar.pipeline.wire import Packet, WireSpec


class WireCast:
    """fp32: the float tensor crosses as it is, in both directions (the decoder rebuilds it bit for bit)."""

    def encode(self, x: Tensor) -> tuple[Tensor, list[Packet]]:
        """Forward: x (mb, T, w) -> (``out``, whose gradient comes back; the payload packets)."""
        return x, [Packet("payload", x.detach())]

    def packets(self, g: Tensor) -> list[Packet]:
        """Backward: ∂L/∂out (mb, T, w) as it crosses."""
        return [Packet("payload", g.to(torch.float32))]

    def specs(self, shape: tuple[int, int], width: int) -> list[WireSpec]:
        """The payload of either direction for a (mb, T) microbatch of ``width`` numbers per token."""
        return [WireSpec("payload", (*shape, width), torch.float32)]

    def decode(self, tensors: list[Tensor]) -> Tensor:
        """The float32 tensor from a received payload (later tensors, e.g. ids, are ignored)."""
        return tensors[0].to(torch.float32)


class Bf16Cast(WireCast):
    """bf16 both ways; forward ``out`` is rounded through bf16 too, so the receiver's copy equals it."""

    def encode(self, x: Tensor) -> tuple[Tensor, list[Packet]]:
        return fake_bf16(x), [Packet("payload", x.detach().to(torch.bfloat16))]

    def packets(self, g: Tensor) -> list[Packet]:
        return [Packet("payload", g.to(torch.bfloat16))]

    def specs(self, shape: tuple[int, int], width: int) -> list[WireSpec]:
        return [WireSpec("payload", (*shape, width), torch.bfloat16)]


class Int8Cast(WireCast):
    """Per-token int8 with an fp32 scale both ways; forward is a straight-through round trip."""

    def encode(self, x: Tensor) -> tuple[Tensor, list[Packet]]:
        p = Int8Codec().encode(x.detach())
        out = straight_through(x, Int8Codec().decode(p, x.dtype))
        return out, [Packet("payload", p.values), Packet("payload", p.scale)]

    def packets(self, g: Tensor) -> list[Packet]:
        p = Int8Codec().encode(g)
        return [Packet("payload", p.values), Packet("payload", p.scale)]

    def specs(self, shape: tuple[int, int], width: int) -> list[WireSpec]:
        return [WireSpec("payload", (*shape, width), torch.int8), WireSpec("payload", (*shape, 1), torch.float32)]

    def decode(self, tensors: list[Tensor]) -> Tensor:
        return Int8Codec().decode(Int8Payload(tensors[0], tensors[1]))


def _stiefel(d: int, r: int, seed: int, boundary: int, identity: bool, role: str, basis: Tensor | None) -> nn.Module:
    return StiefelProjector(d, r, seed, boundary, identity, role)


def _naive(d: int, r: int, seed: int, boundary: int, identity: bool, role: str, basis: Tensor | None) -> nn.Module:
    return NaiveProjector(d, r, seed, boundary, identity, role)


def _fixed(d: int, r: int, seed: int, boundary: int, identity: bool, role: str, basis: Tensor | None) -> nn.Module:
    return FixedSubspace(basis)


FP32, BF16, INT8 = WireCast(), Bf16Cast(), Int8Cast()

for _kind in (
    CodecKind("none", FP32),
    CodecKind("bf16", BF16),
    CodecKind("int8", INT8),
    CodecKind("mapl", FP32, _stiefel, learned=True, stiefel=True),
    CodecKind("ssn", FP32, _fixed, token_table=True),
    CodecKind("naive", FP32, _naive, learned=True),
):
    register_codec(_kind)
