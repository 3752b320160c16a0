"""What a component is, and how one is measured from a model (:mod:`slimpar.sdp.components` finds them).

A :class:`Component` names the parameters (or slices of them) that one mask column switches on or off, with their
bytes and forward FLOPs; :func:`with_shared` adds what no component owns (held and averaged by every worker). Tied
parameters are counted once. Pure: reads module structure and shapes, never communicates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

Level = Literal["block", "neuron"]


class PlanError(ValueError):
    """A plan (components, keep fractions, mask) that cannot be built; the message says why."""


@dataclass(frozen=True)
class Component:
    """One maskable unit. ``params`` are fully qualified (canonical, de-tied) parameter names.

    At neuron level ``index`` is the [start, stop) slice of hidden units and ``dims[j]`` the axis
    of ``params[j]`` that the slice cuts (``buffer_dims`` likewise for ``buffers``); at block
    level ``index`` is None and the component owns its parameters whole.
    """

    name: str
    param_bytes: int  # bytes of the owned parameters (or slices) in their stored dtype
    flops: int  # forward FLOPs per token (per image for convnets), 2 x multiply-adds, approximate
    params: tuple[str, ...]
    index: tuple[int, int] | None = None
    layer: str = ""
    dims: tuple[int, ...] = ()
    buffers: tuple[str, ...] = ()
    buffer_dims: tuple[int, ...] = ()
    numel: int | None = None  # owned elements; None means param_bytes // 4 (fp32 assumed)

    @property
    def elements(self) -> int:
        """Number of parameter elements owned (what a gradient of this component holds)."""
        return self.numel if self.numel is not None else self.param_bytes // 4


Extraction = tuple[list[Component], list[str], int]
Pairs = list[tuple[str, int]]


def split_units(n_units: int, groups: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) groups of ``n_units``; the first ``n_units % groups`` get one extra."""
    if groups < 1:
        raise PlanError(f"neuron groups must be >= 1, got {groups}")
    if groups > n_units:
        raise PlanError(f"{groups} neuron groups requested but the layer has only {n_units} hidden units")
    base, extra = divmod(n_units, groups)
    bounds, start = [], 0
    for g in range(groups):
        stop = start + base + (1 if g < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def canonical_params(model: nn.Module) -> dict[str, nn.Parameter]:
    return dict(model.named_parameters())  # tied parameters appear once, under their first name


def _nbytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()


def _under(names: dict[str, torch.Tensor], prefix: str) -> list[str]:
    return [n for n in names if n.startswith(prefix + ".")]


def with_shared(model: nn.Module, components: list[Component]) -> Extraction:
    """Shared = canonical parameters no component touches. Neuron groups partition the hidden units,
    so a sliced tensor is owned entirely by its layer's groups and never shared."""
    params = canonical_params(model)
    owned = {n for c in components for n in c.params}
    shared = [n for n in params if n not in owned]
    return components, shared, sum(_nbytes(params[n]) for n in shared)


def _slice_size(t: torch.Tensor, dim: int, start: int, stop: int) -> int:
    return t.numel() // t.shape[dim] * (stop - start)


def block_dict(model: nn.Module, attr: str) -> nn.ModuleDict:
    blocks = getattr(model, attr, None)
    if not isinstance(blocks, nn.ModuleDict):
        raise PlanError(f"{type(model).__name__} has no nn.ModuleDict `{attr}` of blocks")
    return blocks


def maskable(block: nn.Module) -> bool:
    return bool(getattr(block, "maskable", True))


def block_component(model: nn.Module, prefix: str, extra_flops: int = 0,
                     positions: dict[str, int] | None = None) -> Component:
    """A whole block: its canonical parameters and buffers. FLOPs = 2 x weight elements (x output
    positions of each conv when known) + ``extra_flops`` (e.g. attention scores)."""
    params = canonical_params(model)
    names = _under(params, prefix)
    buffers = _under(dict(model.named_buffers()), prefix)
    flops = extra_flops
    for n in names:
        p = params[n]
        if p.dim() >= 2:
            pos = (positions or {}).get(n.rsplit(".", 1)[0], 1)
            flops += 2 * p.numel() * pos
    numel = sum(params[n].numel() for n in names)
    return Component(name=prefix, param_bytes=sum(_nbytes(params[n]) for n in names), flops=flops,
                     params=tuple(names), layer=prefix, buffers=tuple(buffers), numel=numel)


def neuron_component(model: nn.Module, layer: str, name: str, index: tuple[int, int],
                      params: list[tuple[str, int]], buffers: list[tuple[str, int]],
                      positions: dict[str, int] | None = None) -> Component:
    """A slice [start, stop) of hidden units across the given (param name, axis) pairs."""
    table = canonical_params(model)
    nbytes = numel = flops = 0
    for pname, dim in params:
        p = table[pname]
        n = _slice_size(p, dim, *index)
        numel += n
        nbytes += n * p.element_size()
        if p.dim() >= 2:
            flops += 2 * n * (positions or {}).get(pname.rsplit(".", 1)[0], 1)
    return Component(name=name, param_bytes=nbytes, flops=flops, params=tuple(p for p, _ in params),
                     index=index, layer=layer, dims=tuple(d for _, d in params),
                     buffers=tuple(b for b, _ in buffers), buffer_dims=tuple(d for _, d in buffers),
                     numel=numel)


def attention_flops(model: nn.Module) -> int:
    """Per-token attention-score FLOPs of one LLaMA block: QK^T and AV over T/2 keys on average
    (causal), each T/2 x dim multiply-adds -> 2 * T * dim FLOPs; 0 when the config is unknown.
    Reads slimpar's ``cfg`` (max_seq_len, dim) or a Hugging Face ``config``."""
    cfg = getattr(model, "cfg", None)
    if cfg is not None:
        return 2 * getattr(cfg, "max_seq_len", 0) * getattr(cfg, "dim", 0)
    hf = getattr(model, "config", None)
    return 2 * getattr(hf, "max_position_embeddings", 0) * getattr(hf, "hidden_size", 0)
