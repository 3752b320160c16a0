"""Physically build one worker's subnetwork from a plan, keeping parameter names stable.

Forward regime: non-held blocks are deleted (``del model.layers["3"]``); non-held neurons/channels
are sliced out, so the worker's weight tensors are smaller (an index map records which global
rows/columns each local tensor holds). Backward regime: the full model stays (every worker runs the
full forward) and non-held blocks stop requiring gradients, so they get neither gradients nor
optimizer state.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from slimpar.sdp.components import Component, model_components
from slimpar.sdp.plan import Plan
from slimpar.sdp.sync import Piece


@dataclass
class Subnet:
    """What this rank holds: sync pieces per component and the index maps of sliced tensors."""

    rank: int
    held: list[int]  # plan columns held by this rank
    regime: str = "forward"
    skeleton: nn.Module | None = None  # the full model on the meta device, taken before the cut (for gathers)
    pieces: dict[int, list[Piece]] = field(default_factory=dict)  # column -> pieces (local slices)
    shared: list[Piece] = field(default_factory=list)
    # local tensor name -> (dim, global indices) for tensors sliced at neuron level
    index_map: dict[str, tuple[int, torch.Tensor]] = field(default_factory=dict)
    frozen: list[str] = field(default_factory=list)  # backward regime: non-held parameter names
    # backward regime: column -> this rank's copy of the component's tensors (held or not), for refresh
    views: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    # backward regime, neuron level: global name -> (module, attribute) whose full tensor is rebuilt
    split: dict[str, tuple[nn.Module, str, int]] = field(default_factory=dict)


class SkippedBlock(nn.Module):
    """Stands in for a block this worker does not hold inside an ``nn.ModuleList`` (whose indices, and so
    parameter names, must not shift): returns the residual stream it is given, as a residual block whose
    branches are zero would. Works for blocks called as ``block(hidden_states, ...)`` that return the
    hidden states (Hugging Face decoder layers in transformers 5)."""

    def forward(self, hidden_states=None, *args, **kwargs):
        return hidden_states if hidden_states is not None else args[0]


def _delete_module(model: nn.Module, path: str) -> None:
    parent, _, key = path.rpartition(".")
    container = model.get_submodule(parent) if parent else model
    if isinstance(container, nn.ModuleDict):
        del container[key]
    elif isinstance(container, nn.ModuleList):
        container[int(key)] = SkippedBlock()
    else:
        setattr(container, key, None)


def unit_position(idx: torch.Tensor, unit: int) -> int:
    """Where global unit ``unit`` sits in a local index list (``Subnet.index_map``: host bookkeeping)."""
    return int((idx == unit).nonzero()[0])


def _layer_units(plan: Plan, rank: int) -> dict[str, list[tuple[int, Component]]]:
    """Neuron components per layer, with whether each is held by ``rank``; columns in plan order."""
    out: dict[str, list[tuple[int, Component]]] = {}
    for c, comp in enumerate(plan.components):
        if comp.index is not None:
            out.setdefault(comp.layer, []).append((c, comp))
    return out


def _slice_tensor(module: nn.Module, attr: str, dim: int, idx: torch.Tensor, is_param: bool) -> None:
    full = getattr(module, attr)
    small = full.detach().index_select(dim, idx.to(full.device)).clone()  # the unit list is host bookkeeping
    if is_param:
        setattr(module, attr, nn.Parameter(small, requires_grad=full.requires_grad))
    else:
        module.register_buffer(attr, small)


def _slice_layer(model: nn.Module, sub: Subnet, units: list[tuple[int, Component]]) -> None:
    """Keep only the held hidden units of one layer; record each held component's local slice."""
    held = [(c, comp) for c, comp in units if c in sub.held]
    idx = torch.cat([torch.arange(*comp.index) for _, comp in held]) if held else torch.zeros(0, dtype=torch.long)
    first = units[0][1]
    for names, dims, is_param in ((first.params, first.dims, True), (first.buffers, first.buffer_dims, False)):
        for name, dim in zip(names, dims, strict=True):
            mod_path, _, attr = name.rpartition(".")
            _slice_tensor(model.get_submodule(mod_path), attr, dim, idx, is_param)
            sub.index_map[name] = (dim, idx)
    params = dict(model.named_parameters())
    offset = 0
    for c, comp in held:
        n = comp.index[1] - comp.index[0]
        sub.pieces[c] = [Piece(params[name], name, dim, offset, offset + n)
                         for name, dim in zip(comp.params, comp.dims, strict=True)]
        offset += n


def _split_layer(model: nn.Module, sub: Subnet, units: list[tuple[int, Component]]) -> None:
    """Backward masking at neuron level: keep the whole layer, but reorder its hidden units as
    [held..., not held...] (the same permutation for every tensor of the layer, so the function is
    unchanged) and split each tensor into a trainable held part and a frozen buffer. A forward
    pre-hook concatenates them, so gradients and optimizer state exist only for held units."""
    held = [(c, comp) for c, comp in units if c in sub.held]
    rest = [(c, comp) for c, comp in units if c not in sub.held]
    order = held + rest
    perm = torch.cat([torch.arange(*comp.index) for _, comp in order])
    n_held = sum(comp.index[1] - comp.index[0] for _, comp in held)
    first = units[0][1]
    for name, dim in zip(first.buffers, first.buffer_dims, strict=True):
        mod_path, _, attr = name.rpartition(".")
        _slice_tensor(model.get_submodule(mod_path), attr, dim, perm, is_param=False)
        sub.index_map[name] = (dim, perm)
    parts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, dim in zip(first.params, first.dims, strict=True):
        parts[name] = _split_param(model, sub, name, dim, perm, n_held)
    offset = 0
    for c, comp in order:
        n = comp.index[1] - comp.index[0]
        is_held, start = c in sub.held, offset if c in sub.held else offset - n_held
        sub.views[c] = [parts[name][0 if is_held else 1].narrow(dim, start, n)
                        for name, dim in zip(comp.params, comp.dims, strict=True)]
        if is_held:
            sub.pieces[c] = [Piece(parts[name][0], name + "_held", dim, start, start + n)
                             for name, dim in zip(comp.params, comp.dims, strict=True)]
        offset += n


def _split_param(model: nn.Module, sub: Subnet, name: str, dim: int, perm: torch.Tensor, n_held: int):
    mod_path, _, attr = name.rpartition(".")
    module = model.get_submodule(mod_path)
    weight = getattr(module, attr).detach()
    full = weight.index_select(dim, perm.to(weight.device))  # CUDA's index_select takes a device index only
    held = nn.Parameter(full.narrow(dim, 0, n_held).clone())
    frozen = full.narrow(dim, n_held, full.shape[dim] - n_held).clone()
    del module._parameters[attr]
    module.register_parameter(attr + "_held", held)
    module.register_buffer(attr + "_frozen", frozen)
    setattr(module, attr, torch.cat([held, frozen], dim))

    def rebuild(m: nn.Module, _args, attr=attr, dim=dim) -> None:
        setattr(m, attr, torch.cat([getattr(m, attr + "_held"), getattr(m, attr + "_frozen")], dim))

    module.register_forward_pre_hook(rebuild)
    sub.index_map[name] = (dim, perm)
    sub.split[name] = (module, attr, dim)
    return held, frozen


def meta_skeleton(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose tensors live on the meta device (no data is copied)."""
    memo: dict[int, torch.Tensor] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(model, memo)


def shared_names_of(model: nn.Module, plan: Plan) -> list[str]:
    """The parameters every worker holds: the plan's record of them, else what the model's structure says."""
    if plan.shared_params:
        return list(plan.shared_params)
    layers: dict[str, int] = {}
    for c in plan.components:
        if c.index is not None:
            layers[c.layer] = layers.get(c.layer, 0) + 1
    level = "neuron" if layers else "block"
    _, shared, _ = model_components(model, level, max(layers.values()) if layers else 4)
    return shared


def apply_subnet(model: nn.Module, plan: Plan, rank: int, shared_names: list[str] | None = None,
                 regime: str = "forward") -> Subnet:
    """Turn the full ``model`` into ``rank``'s subnetwork in place (see the module docstring); ``shared_names``
    default to :func:`shared_names_of`."""
    if shared_names is None:
        shared_names = shared_names_of(model, plan)
    sub = Subnet(rank=rank, held=[c for c in range(len(plan.components)) if plan.mask[rank, c]], regime=regime,
                 skeleton=meta_skeleton(model))
    block_cols = [c for c, comp in enumerate(plan.components) if comp.index is None]
    if regime == "forward":
        for c in block_cols:
            if c not in sub.held:
                _delete_module(model, plan.components[c].name)
        for units in _layer_units(plan, rank).values():
            _slice_layer(model, sub, units)
    elif regime == "backward":
        params = dict(model.named_parameters())
        for c in block_cols:
            sub.views[c] = [params[n] for n in plan.components[c].params]
            if c not in sub.held:
                for name in plan.components[c].params:
                    params[name].requires_grad_(False)
                    sub.frozen.append(name)
        for units in _layer_units(plan, rank).values():
            _split_layer(model, sub, units)
    else:
        raise ValueError(f"unknown SDP regime {regime!r}; choose 'forward' or 'backward'")
    params = dict(model.named_parameters())
    for c in block_cols:
        if c in sub.held:
            sub.pieces[c] = [Piece(params[n], n) for n in plan.components[c].params]
    sub.shared = [Piece(params[n], n) for n in shared_names]
    return sub
