"""The codec registry: what a ``pipeline.codec`` name means, declared in one place per kind.

A ``CodecKind`` declares everything the rest of slimpar reads about a codec:

- its projector (d → r per token, or none: all d numbers cross) and its traits (learned, Stiefel, token table);
- its wire cast: how the float tensor that crosses a boundary is encoded, forward and backward;
- its own settings: a frozen dataclass of typed fields with defaults (``settings``), which the run config gives
  as ``pipeline.codec_options = "key=value,..."`` and the library as ``CodecSpec(..., settings=...)``;
  ``check`` validates them against the boundary width d;
- its bytes per token, forward and backward (``wire_bytes``), counted from the specs its cast sends, so the
  byte budget (budget.py) and the wire cannot disagree.

``codec_settings`` is the one path from options to a kind's settings: specs, the start-up checks and the
checkpoint layout all call it. ``register_codec`` adds a kind (codec_kinds.py registers the built-in ones),
``unregister_codec`` removes one (tests that register their own).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, get_type_hints

from torch import Tensor, nn

from slimpar.pipeline.wire import Packet, WireSpec


class WireCastLike(Protocol):
    """How a boundary's float tensor (mb, T, w) crosses, in both directions (codec_kinds.WireCast implements it)."""

    def encode(self, x: Tensor) -> tuple[Tensor, list[Packet]]: ...  # forward: (out, payload packets)

    def packets(self, g: Tensor) -> list[Packet]: ...  # backward: ∂L/∂out as it crosses

    def specs(self, shape: tuple[int, int], width: int) -> list[WireSpec]: ...  # either direction's payload

    def decode(self, tensors: list[Tensor]) -> Tensor: ...  # the float32 tensor from a received payload


# (d, r, seed, boundary, identity start, role, SSN's fixed basis U or None) -> the projector of one end;
# both ends build it from the same numbers, so seed-derived starts match without a message
ProjectorBuilder = Callable[[int, int, int, int, bool, str, "Tensor | None"], nn.Module]


@dataclass(frozen=True)
class CodecKind:
    """One kind of boundary codec: how its tensor crosses (a cast), its projector, its traits and its settings."""

    name: str  # the ``pipeline.codec`` / ``CodecSpec.kind`` value
    cast: WireCastLike | None = None  # how the float tensor crosses; None: ``build_cast`` makes it from settings
    projector: ProjectorBuilder | None = None  # d -> r per token; None: all d numbers cross
    learned: bool = False  # a learned projector: anchors may take the token part of the stream off it
    stiefel: bool = False  # the projector is MAPL's A ∈ St(d, r): SPEL steps it, the PCA start can start it
    token_table: bool = False  # SSN: a fixed token table is the anchor, the model is reparametrised into span(U)
    settings: type | None = None  # a frozen dataclass of the kind's own settings (typed fields with defaults)
    build_cast: Callable[[Any, int], WireCastLike] | None = None  # (settings, width w) -> the cast
    check: Callable[[Any, int], None] | None = None  # (settings, d): raise ValueError naming the fix

    def __post_init__(self) -> None:
        if (self.cast is None) == (self.build_cast is None):
            raise ValueError(f"codec {self.name!r}: give exactly one of cast and build_cast")
        if self.build_cast is not None and self.settings is None:
            raise ValueError(f"codec {self.name!r}: build_cast needs the settings it builds from")
        if self.settings is not None and not dataclasses.is_dataclass(self.settings):
            raise TypeError(f"codec {self.name!r}: settings must be a dataclass type")

    @property
    def projects(self) -> bool:
        return self.projector is not None

    def configured(self, settings: Any, width: int) -> CodecKind:
        """This kind with its cast built from ``settings`` for ``width`` numbers per token (itself when fixed)."""
        if self.build_cast is None:
            return self
        return dataclasses.replace(self, cast=self.build_cast(settings, width), build_cast=None)

    def wire_bytes(self, shape: tuple[int, int], width: int, settings: Any = None) -> dict[str, int]:
        """{"fwd", "bwd"}: bytes of one (mb, T) microbatch's payload each way, from the specs the cast sends."""
        cast = self.configured(settings, width).cast
        n = sum(s.nbytes() for s in cast.specs(shape, width))
        return {"fwd": n, "bwd": n}

    def bytes_per_token(self, width: int, settings: Any = None) -> dict[str, int]:
        """{"fwd", "bwd"}: payload bytes per token each way (``wire_bytes`` of a one-token microbatch)."""
        return self.wire_bytes((1, 1), width, settings)


CODEC_KINDS: dict[str, CodecKind] = {}  # name -> kind, in registration order (the built-ins first)


def register_codec(kind: CodecKind) -> CodecKind:
    """Add ``kind`` to the registry; ValueError when its name is taken (unregister the old one first)."""
    if kind.name in CODEC_KINDS:
        raise ValueError(f"codec {kind.name!r} is registered already")
    CODEC_KINDS[kind.name] = kind
    return kind


def unregister_codec(name: str) -> None:
    """Remove the kind called ``name`` (a test's own codec, when the test ends)."""
    CODEC_KINDS.pop(name, None)


def codec_kind(name: str) -> CodecKind:
    """The kind called ``name``; ValueError names the known ones."""
    if name not in CODEC_KINDS:
        raise ValueError(f"unknown codec {name!r}; choose from {', '.join(CODEC_KINDS)}")
    return CODEC_KINDS[name]


def names(which: Callable[[CodecKind], bool]) -> list[str]:
    """Names of the kinds with a trait, in table order (for messages: "mapl or naive")."""
    return [k.name for k in CODEC_KINDS.values() if which(k)]


def parse_options(options: str) -> dict[str, str]:
    """``"k=32,scale=0.5"`` -> {"k": "32", "scale": "0.5"}; "" -> {}."""
    out: dict[str, str] = {}
    for item in (s.strip() for s in options.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"codec option {item!r} is not key=value (options look like k=32,scale=0.5)")
        out[key.strip()] = value.strip()
    return out


def _coerce(value: Any, tp: type, where: str) -> Any:
    """``value`` (a string from the command line, or a typed value) as the setting's declared type."""
    if tp is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "false", "1", "0", "yes", "no"):
            return str(value).lower() in ("true", "1", "yes")
    elif tp in (int, float, str) and not isinstance(value, bool):
        try:
            return tp(value) if tp is not int else int(str(value), 10)
        except ValueError:
            pass
    raise ValueError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r}")


def _from_mapping(kind: CodecKind, options: Mapping[str, Any]) -> Any:
    hints = get_type_hints(kind.settings)
    fields = [f.name for f in dataclasses.fields(kind.settings)]
    for key in options:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, 1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"codec {kind.name!r} has no option {key!r} ({hint}its options: {', '.join(fields)})")
    values = {k: _coerce(v, hints[k], f"codec {kind.name!r} option {k}") for k, v in options.items()}
    return kind.settings(**values)


def codec_settings(name: str, options: str | Mapping[str, Any] | Any = "", dim: int | None = None) -> Any:
    """The settings of codec ``name`` from ``options`` ("key=value,...", a mapping, or the settings themselves;
    empty: the defaults), checked against width ``dim`` when given; None for a kind without settings.
    ValueError names the option and the fix."""
    kind = codec_kind(name)
    if kind.settings is None:
        if options not in ("", None) and options != {}:
            raise ValueError(f"codec {name!r} takes no codec options (got {options!r})")
        return None
    if isinstance(options, kind.settings):
        settings = options
    elif isinstance(options, str | Mapping) or options is None:
        raw = parse_options(options) if isinstance(options, str) else dict(options or {})
        settings = _from_mapping(kind, raw)
    else:
        raise TypeError(f"codec {name!r}: options must be a string, a mapping or {kind.settings.__name__}")
    if kind.check is not None and dim is not None:
        kind.check(settings, dim)
    return settings
