"""Row routing for :class:`~slimpar.sdp.batched.BatchedSDP`: which rows of a concatenated batch each component
sees, and the patched ``forward`` of every routed module (a block, or a neuron-level layer's MLP).

A routed module's ``forward`` is replaced on the instance (as :func:`slimpar.parallel.ac.apply_ac` does, so
parameter names stay those of the full model). Outside ``BatchedSDP.rows`` it calls the original forward
unchanged. Inside, block c (rows worker-major, ``Rows``):

- forward regime: ``h.index_copy(0, held, f(h[held]))``: holders' rows run the block, the rest pass through
  (the deleted block of a LLaMA subnetwork is the identity on the residual stream);
- backward regime: ``f(h[held])`` with the parameters, ``f(h[other])`` through ``functional_call`` with them
  detached, put back in row order: every row runs the full model, only holders' rows reach the gradient.

A neuron-level layer runs once per worker on its rows, with the held units selected (forward regime: the
tensors ``apply_subnet`` would slice, in the same unit order) or the non-held units detached (backward).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from slimpar.sdp.components import Component


@dataclass
class Rows:
    """Where each worker's rows sit in a concatenated batch, and each block column's row split."""

    spans: list[tuple[int, int]]  # worker w's rows [start, stop)
    held: list[torch.Tensor]  # column -> rows of its holders (ascending)
    other: list[torch.Tensor]  # column -> rows of the other workers (ascending)
    order: list[torch.Tensor]  # column -> where each row sits in cat([held rows, other rows])

    @classmethod
    def build(cls, mask: np.ndarray, counts: tuple[int, ...], device: torch.device) -> Rows:
        """``mask``: (N, K) plan; ``counts``: rows per worker. The bookkeeping is host arithmetic on the plan
        (numpy); each index list is copied to ``device`` once, where the routed modules index activations."""
        mask = np.asarray(mask, dtype=bool)
        worker = np.repeat(np.arange(len(counts)), counts)  # (B,) worker of each row
        stops = np.cumsum(counts).tolist()
        spans = [(stop - c, stop) for stop, c in zip(stops, counts, strict=True)]
        held, other, order = [], [], []
        for c in range(mask.shape[1]):
            h, o = np.flatnonzero(mask[worker, c]), np.flatnonzero(~mask[worker, c])
            held.append(torch.as_tensor(h, dtype=torch.long, device=device))
            other.append(torch.as_tensor(o, dtype=torch.long, device=device))
            order.append(torch.as_tensor(np.argsort(np.concatenate([h, o])), dtype=torch.long, device=device))
        return cls(spans, held, other, order)


def layer_module(comp: Component) -> tuple[str, list[str]]:
    """The innermost module holding every tensor a neuron component slices, and those tensors' names in it."""
    parts = [name.split(".")[:-1] for name in comp.params]
    common: list[str] = []
    for level in zip(*parts, strict=False):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    path = ".".join(common)
    return path, [name[len(path) + 1:] if path else name for name in comp.params]


class BlockRoute:
    """Block column ``c``: its rows run it (forward regime), or reach its gradient (backward regime)."""

    def __init__(self, owner, block: nn.Module, c: int):
        self.owner, self.block, self.c = owner, block, c
        if getattr(block, "_slimpar_ac", False):
            raise ValueError(f"{type(block).__name__} is already activation-checkpointed: apply checkpointing "
                             "after BatchedSDP, so that it recomputes the routed forward")
        self.original = block.forward
        block.forward = self.forward

    def forward(self, h: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        rows = self.owner.current
        if rows is None:
            return self.original(h, *args, **kwargs)
        held, other = rows.held[self.c], rows.other[self.c]
        if other.numel() == 0:  # every worker holds it
            return self.original(h, *args, **kwargs)
        out = self.original(h.index_select(0, held), *args, **kwargs) if held.numel() else h[:0]
        if self.owner.regime == "forward":
            return h.index_copy(0, held, out)
        frozen = {n: p.detach() for n, p in self.block.named_parameters()}
        rest = _call_unrouted(self.block, self.original, frozen, (h.index_select(0, other), *args), kwargs)
        return torch.cat([out, rest]).index_select(0, rows.order[self.c])


class NeuronRoute:
    """The MLP ``module`` whose hidden units are split into the neuron columns ``cols`` (one layer)."""

    def __init__(self, owner, module: nn.Module, cols: list[int]):
        self.owner, self.module = owner, module
        comps = [owner.plan.components[c] for c in cols]
        _, self.names = layer_module(comps[0])
        self.dims = list(comps[0].dims)
        params = dict(module.named_parameters())
        device = params[self.names[0]].device
        n_units = params[self.names[0]].shape[self.dims[0]]
        self.units: list[torch.Tensor] = []  # worker -> its held unit indices, in plan order
        self.held: list[torch.Tensor] = []  # worker -> (n_units,) bool
        self.all_held: list[bool] = []
        for w in range(owner.plan.world_size):
            idx = [torch.arange(*comp.index) for c, comp in zip(cols, comps, strict=True) if owner.plan.mask[w, c]]
            units = torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long)
            on = torch.zeros(n_units, dtype=torch.bool)
            on[units] = True
            self.units.append(units.to(device))
            self.held.append(on.to(device))
            self.all_held.append(bool(on.all()))
        self.original = module.forward
        module.forward = self.forward

    def _params(self, w: int) -> dict[str, torch.Tensor]:
        params = dict(self.module.named_parameters())
        units, on = self.units[w], self.held[w]
        out = {}
        for name, dim in zip(self.names, self.dims, strict=True):
            p = params[name]
            if self.all_held[w]:
                out[name] = p
            elif self.owner.regime == "forward":
                out[name] = p.index_select(dim, units)
            else:
                shape = [1] * p.dim()
                shape[dim] = p.shape[dim]
                out[name] = torch.where(on.view(shape), p, p.detach())
        return out

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        rows = self.owner.current
        if rows is None:
            return self.original(x, *args, **kwargs)
        outs = [_call_unrouted(self.module, self.original, self._params(w), (x[start:stop], *args), kwargs)
                for w, (start, stop) in enumerate(rows.spans)]
        return torch.cat(outs)


def _call_unrouted(module: nn.Module, original, params: dict[str, torch.Tensor], args: tuple, kwargs: dict):
    """``module``'s original forward with ``params`` in place of its own (``functional_call``; the routed
    forward, or activation checkpointing around it, is set aside meanwhile so that nothing nests)."""
    routed = module.forward
    module.forward = original
    try:
        return functional_call(module, params, args, kwargs)
    finally:
        module.forward = routed
