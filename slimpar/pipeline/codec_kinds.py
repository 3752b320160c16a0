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

A new codec is one ``CodecKind`` entry (and, if it casts differently, one ``WireCast``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from slimpar.codecs.projector import FixedSubspace, NaiveProjector, StiefelProjector
from slimpar.codecs.quant import Int8Codec, Int8Payload, fake_bf16, straight_through
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


# (d, r, seed, boundary, identity start, role, SSN's fixed basis U or None) -> the projector of one end;
# both ends build it from the same numbers, so seed-derived starts match without a message
ProjectorBuilder = Callable[[int, int, int, int, bool, str, "Tensor | None"], nn.Module]


def _stiefel(d: int, r: int, seed: int, boundary: int, identity: bool, role: str, basis: Tensor | None) -> nn.Module:
    return StiefelProjector(d, r, seed, boundary, identity, role)


def _naive(d: int, r: int, seed: int, boundary: int, identity: bool, role: str, basis: Tensor | None) -> nn.Module:
    return NaiveProjector(d, r, seed, boundary, identity, role)


def _fixed(d: int, r: int, seed: int, boundary: int, identity: bool, role: str, basis: Tensor | None) -> nn.Module:
    return FixedSubspace(basis)


@dataclass(frozen=True)
class CodecKind:
    name: str  # the ``pipeline.codec`` / ``CodecSpec.kind`` value
    cast: WireCast  # how the float tensor crosses, forward and backward
    projector: ProjectorBuilder | None = None  # d -> r per token; None: all d numbers cross
    learned: bool = False  # a learned projector: anchors may take the token part of the stream off it
    stiefel: bool = False  # the projector is MAPL's A ∈ St(d, r): SPEL steps it, the PCA start can start it
    token_table: bool = False  # SSN: a fixed token table is the anchor, the model is reparametrised into span(U)

    @property
    def projects(self) -> bool:
        return self.projector is not None


FP32, BF16, INT8 = WireCast(), Bf16Cast(), Int8Cast()

CODEC_KINDS: dict[str, CodecKind] = {k.name: k for k in (
    CodecKind("none", FP32),
    CodecKind("bf16", BF16),
    CodecKind("int8", INT8),
    CodecKind("mapl", FP32, _stiefel, learned=True, stiefel=True),
    CodecKind("ssn", FP32, _fixed, token_table=True),
    CodecKind("naive", FP32, _naive, learned=True),
)}


def codec_kind(name: str) -> CodecKind:
    """The kind called ``name``; ValueError names the known ones."""
    if name not in CODEC_KINDS:
        raise ValueError(f"unknown codec {name!r}; choose from {', '.join(CODEC_KINDS)}")
    return CODEC_KINDS[name]


def names(which: Callable[[CodecKind], bool]) -> list[str]:
    """Names of the kinds with a trait, in table order (for messages: "mapl or naive")."""
    return [k.name for k in CODEC_KINDS.values() if which(k)]
