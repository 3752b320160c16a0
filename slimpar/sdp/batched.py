"""Virtual SDP in one batched pass: N workers' subnetworks trained on ONE copy of the full model.

``VirtualSDP`` runs N model copies one after another and equals the N-process run bit for bit; ``BatchedSDP`` gives
the same training to rounding (docs/methods.md, 'Holder averaging') with one copy and one optimizer, at about the
cost of one forward and backward of the concatenated batch with each block run on its holders' rows only.

Why one copy suffices: after every step's averaging the holders of a component hold identical copies
(forward regime), and in the backward regime with ``refresh_every = 1`` the non-holders' copies are refreshed
from a holder, so all N copies of every tensor are equal at the start of a step. What differs between workers
is only which rows (their batch) see which components and which rows' gradients reach which components.

One step (rows of the concatenated batch are worker-major: worker w's b_w rows, then worker w+1's):

1. forward on all rows, each routed component seeing only its rows:
   - block level, forward regime: block c runs on the rows of its holders S_c; the rows of other workers
     skip it (identity on the residual stream, what deleting the block from a LLaMA ``ModuleDict`` means in
     :func:`~slimpar.sdp.apply.apply_subnet`);
   - block level, backward regime: every row runs block c, holders' rows with its parameters, the other rows
     with the same parameters detached (``torch.func.functional_call``), so its parameter gradient comes
     from holders' rows only while every row's activation gradient flows through it. This costs no extra
     FLOPs (the two calls split the rows); per-sample gradients (``vmap``) would hold B copies of the
     gradient;
   - neuron level: a layer's module (the SwiGLU MLP) runs once per worker on that worker's rows, forward
     regime with the held hidden units' rows/columns selected (``index_select``, exactly the sliced tensors
     of :func:`apply_subnet`, no rescaling), backward regime with the full tensors in which non-held units
     are detached (``torch.where``);
   - the shared parameters (embedding, attention at neuron level, norms, head) run on all rows;
2. loss = Σ_w L_w (worker w's own mean loss), backward: component c's gradient is Σ_{w∈S_c} g_{w,c}, a shared
   parameter's Σ_w g_w;
3. ``average_grads()``: divide component c's gradient by k_c = |S_c| (per hidden unit at neuron level), the
   shared gradients by N: exactly the holder average ĝ_c = (1/k_c) Σ_{i∈S_c} g_{i,c} of the real run;
4. ``clip_grad_norm_``: the norm of this one averaged gradient (float64, as ``HolderSync``), then the caller's
   optimizer step (AdamW is elementwise: one copy steps as every holder would) and nothing to refresh.

Equal to rounding, not bit for bit: rows of several workers meet in one matrix product, so sums run in
another order than each worker's own. Needs a model whose blocks are called ``block(h, *args)`` with ``h``
batch-major and ``args`` not (slimpar's LLaMA) and has no BatchNorm (a worker's statistics are its own batch's).

    b = BatchedSDP(model, plan, regime="forward")
    with b.rows([len(x) for x in xs]):      # keep backward inside: checkpointing recomputes under the routing
        logits = model(torch.cat(xs))
        sum(loss_fn(l, y) for l, y in zip(logits.split(b.counts), ys)).backward()
    b.average_grads(); b.clip_grad_norm_(1.0); opt.step()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from slimpar.sdp.apply import meta_skeleton, shared_names_of
from slimpar.sdp.batched_routes import BlockRoute, NeuronRoute, Rows, layer_module
from slimpar.sdp.gather import materialize
from slimpar.sdp.plan import Plan

__all__ = ["BatchedSDP"]


class BatchedSDP:
    """All ``plan.world_size`` SDP workers on one copy of ``model`` (see the module docstring).

    Args:
        model: the full model, already on its device: its blocks' (neuron level: MLPs') ``forward`` is routed
            in place; outside :meth:`rows` it is the plain model. Activation checkpointing goes on after
            (``apply_ac``: it then recomputes the routed forward).
        plan: the mask plan; worker w = row w.
        regime: "forward" or "backward" (the backward regime assumes ``refresh_every = 1``).
        shared_names: parameters every worker holds (default: the plan's, else from the model).
    """

    def __init__(self, model: nn.Module, plan: Plan, regime: str = "forward",
                 shared_names: list[str] | None = None):
        if regime not in ("forward", "backward"):
            raise ValueError(f"unknown SDP regime {regime!r}; choose 'forward' or 'backward'")
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            raise ValueError("BatchedSDP cannot batch a model with BatchNorm: each worker's statistics come from "
                             "its own batch; use VirtualSDP (one copy per worker)")
        self.model, self.plan, self.regime = model, plan, regime
        self.skeleton = meta_skeleton(model)  # before routing patches the forwards (for full_model copies)
        self.mask = torch.as_tensor(plan.mask, dtype=torch.bool)  # (N, K)
        self.current: Rows | None = None
        self.counts: list[int] = []
        self._cache: dict[tuple[int, ...], Rows] = {}
        self.last_drift = 0.0  # backward regime: one copy, so nothing is ever stale
        self.routes = self._install(model)
        self.scales = self._grad_scales(model, shared_names or shared_names_of(model, plan))

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    def _install(self, model: nn.Module) -> list[BlockRoute | NeuronRoute]:
        routes: list[BlockRoute | NeuronRoute] = []
        layers: dict[str, list[int]] = {}
        for c, comp in enumerate(self.plan.components):
            if comp.index is None:
                routes.append(BlockRoute(self, model.get_submodule(comp.name), c))
            else:
                layers.setdefault(comp.layer, []).append(c)
        for cols in layers.values():
            path, _ = layer_module(self.plan.components[cols[0]])
            routes.append(NeuronRoute(self, model.get_submodule(path), cols))
        return routes

    def _grad_scales(self, model: nn.Module, shared: list[str]) -> list[tuple[nn.Parameter, float | torch.Tensor]]:
        """(parameter, 1/holders): 1/N for shared parameters, 1/k_c for block c, per hidden unit at neuron level."""
        params, n = dict(model.named_parameters()), self.plan.world_size
        out: dict[str, float | torch.Tensor] = {name: 1.0 / n for name in shared}
        for c, comp in enumerate(self.plan.components):
            k = len(self.plan.holders(c))
            for j, name in enumerate(comp.params):
                if comp.index is None:
                    out[name] = 1.0 / k
                    continue
                p, dim = params[name], comp.dims[j]
                if not isinstance(out.get(name), torch.Tensor):
                    shape = [1] * p.dim()
                    shape[dim] = p.shape[dim]
                    out[name] = torch.ones(shape, dtype=p.dtype, device=p.device)
                out[name].narrow(dim, comp.index[0], comp.index[1] - comp.index[0]).fill_(1.0 / k)
        missing = [name for name, p in params.items() if p.requires_grad and name not in out]
        if missing:
            raise ValueError(f"parameters in no component and not shared: {missing[:5]}")
        return [(params[name], s) for name, s in out.items()]

    # ------------------------------------------------------------------ one step
    @contextlib.contextmanager
    def rows(self, counts: list[int]) -> Iterator[Rows]:
        """Route the model's components for a batch of ``counts[w]`` rows of worker w, worker-major; forward
        and backward both run inside (activation checkpointing recomputes forwards during backward)."""
        if len(counts) != self.plan.world_size or min(counts) < 1:
            raise ValueError(f"need a positive row count for each of the {self.plan.world_size} workers, "
                             f"got {counts}")
        key = tuple(int(c) for c in counts)
        if key not in self._cache:
            self._cache[key] = Rows.build(self.plan.mask, key, self._device())
        previous, self.current, self.counts = self.current, self._cache[key], list(key)
        try:
            yield self.current
        finally:
            self.current = previous

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def average_grads(self) -> None:
        """Holder averaging on the one copy: each gradient (a sum over its holders' rows) / its holder count
        (one fused multiply per distinct scalar; neuron-level tensors by their per-unit scale)."""
        by_scale: dict[float, list[torch.Tensor]] = {}
        for p, s in self.scales:
            if p.grad is None:
                continue
            if isinstance(s, torch.Tensor):
                p.grad.mul_(s)
            else:
                by_scale.setdefault(s, []).append(p.grad)
        for s, grads in by_scale.items():
            torch._foreach_mul_(grads, s)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the norm of the averaged gradient (per-tensor norms, combined in float64); returns that norm as
        a device scalar, the factor applied on the device (1 where the norm is under ``max_norm``)."""
        grads = [p.grad for p, _ in self.scales if p.grad is not None]
        # no gradient yet: a zero on the model's device, where the norm always is (never a device read off `grads`)
        norms = (torch.stack(torch._foreach_norm(grads)).double() if grads
                 else torch.zeros(1, dtype=torch.float64, device=self._device()))
        norm = norms.pow(2).sum().sqrt()
        if max_norm > 0 and grads:
            torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))
        return norm

    # --------------------------------------------------------------- full model
    @torch.no_grad()
    def full_model(self, device: torch.device | str | None = None, rescale: str = "none") -> nn.Module:
        """A plain copy of the one model (unrouted; for evaluation and export; on the model's device unless
        ``device`` says); ``rescale="survival"`` scales block c's residual branches by k_c / N, as
        ``HolderSync.gather_full_model`` does."""
        if device is None:
            device = next(self.model.parameters()).device
        full = materialize(self.skeleton, torch.device(device))
        mine = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        for name, t in list(full.named_parameters()) + list(full.named_buffers()):
            t.copy_(mine[name])
        if rescale == "survival":
            for c, comp in enumerate(self.plan.components):
                if comp.index is None:
                    full.get_submodule(comp.name).residual_scale = len(self.plan.holders(c)) / self.plan.world_size
        return full
