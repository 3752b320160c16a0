"""An independent single-process reference for Subnetwork Data Parallelism.

The method it checks: docs/methods.md, 'Subnetwork data parallelism (SDP)'.

Every worker of a run is simulated in one process from the same initial full model:

- forward masking: worker i runs the full model with its non-held blocks skipped (a shallow copy
  whose block ModuleDict holds only the held blocks) or, at neuron level, with only its held hidden
  units/channels (``torch.func.functional_call`` with ``index_select`` slices of the full
  parameters, so gradients land in the right rows/columns of the full tensors);
- backward masking: the full forward for every worker, gradients kept for held components only.

Each component's gradient is averaged over its holders by hand (shared parameters over all
workers), the full averaged gradient is clipped by its global norm, and ``torch.optim.AdamW`` is
applied with the trainer's parameter groups, hyper-parameters and schedule. Each worker keeps its own
buffers (BatchNorm running statistics come from its own batches); the exported buffers are taken
from each component's first holder and shared ones from worker 0, as the SDP export documents.

Only the plan (``plan_from_config``) and the trainer's model/data/loss/schedule are reused; nothing
of ``slimpar.sdp``'s apply/sync/wrapper/gather code is. ``expected_comm_bytes`` is a hand count of
what each rank feeds into collectives in one step, from the mask and the model's tensor shapes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call

from slimpar.config import Config
from slimpar.sdp.roots import refresh_roots
from slimpar.train.build import build_data, build_model, loss_fn, lr_at, total_steps
from slimpar.train.strategies.sdp_plan import plan_from_config
from slimpar.train.validate.checks import load_run_config

Region = tuple[int | None, int, int, tuple[int, ...]]  # (dim or None for whole, start, stop, holders)


@dataclass
class Reference:
    """What the simulation ends with: the full model's parameters and exported buffers, per-step
    losses (mean over workers, as the trainer logs them), the plan, the model and its initial parameters."""

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    losses: list[float] = field(default_factory=list)
    plan: object = None
    model: nn.Module | None = None
    initial: dict[str, torch.Tensor] = field(default_factory=dict)


def config_for(config: Path, overrides: list[str]) -> Config:
    """The run configuration ``slimpar train --config CONFIG *overrides`` resolves to."""
    return load_run_config(config, list(overrides))


def param_regions(plan, model: nn.Module) -> dict[str, list[Region]]:
    """For every canonical parameter: the regions it is split into and who holds each region.
    Shared parameters are one region held by all workers; a block owns its parameters whole; a
    neuron/channel group owns a [start, stop) slice along its axis of each of its parameters."""
    everyone = tuple(range(plan.world_size))
    regions: dict[str, list[Region]] = {n: [] for n, _ in model.named_parameters()}
    for c, comp in enumerate(plan.components):
        holders = tuple(int(i) for i in plan.mask[:, c].nonzero()[0])
        for j, name in enumerate(comp.params):
            if comp.index is None:
                regions[name].append((None, 0, 0, holders))
            else:
                regions[name].append((comp.dims[j], comp.index[0], comp.index[1], holders))
    for parts in regions.values():
        if not parts:
            parts.append((None, 0, 0, everyone))
    return regions


def _region(t: torch.Tensor, dim: int | None, start: int, stop: int) -> torch.Tensor:
    return t if dim is None else t.narrow(dim, start, stop - start)


def held_slices(plan, rank: int) -> dict[str, tuple[int, torch.Tensor]]:
    """Neuron level: tensor name -> (axis, ascending global indices of ``rank``'s held units)."""
    parts: dict[str, tuple[int, list[torch.Tensor]]] = {}
    for c, comp in enumerate(plan.components):
        if comp.index is None:
            continue
        pairs = list(zip(comp.params, comp.dims, strict=True)) + list(zip(comp.buffers, comp.buffer_dims, strict=True))
        for name, dim in pairs:
            _, chunks = parts.setdefault(name, (dim, []))
            if plan.mask[rank, c]:
                chunks.append(torch.arange(*comp.index))
    empty = torch.zeros(0, dtype=torch.long)
    return {n: (d, torch.cat(ch) if ch else empty) for n, (d, ch) in parts.items()}


def block_view(model: nn.Module, plan, rank: int) -> nn.Module:
    """A shallow copy of ``model`` whose block ModuleDicts keep only ``rank``'s held blocks (the
    same module and Parameter objects); the model itself when nothing is dropped."""
    dropped = {comp.name for c, comp in enumerate(plan.components)
               if comp.index is None and not plan.mask[rank, c]}
    if not dropped:
        return model
    view = copy.copy(model)
    view._modules = dict(model._modules)
    for attr in sorted({name.split(".")[0] for name in dropped}):
        blocks = getattr(model, attr)
        kept = {k: b for k, b in blocks.items() if f"{attr}.{k}" not in dropped}
        setattr(view, attr, nn.ModuleDict(kept))
    return view


def worker_loss(model: nn.Module, plan, rank: int, regime: str, buffers: dict[str, torch.Tensor],
                x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Worker ``rank``'s loss on its batch with its subnetwork (forward regime) or the full model
    (backward regime), using its own buffers; sliced buffers are written back after the forward."""
    view = model if regime == "backward" else block_view(model, plan, rank)
    slices = {} if regime == "backward" else held_slices(plan, rank)
    present = dict(view.named_parameters()) | dict(view.named_buffers())
    tensors: dict[str, torch.Tensor] = {}
    for name, t in {**dict(model.named_parameters()), **buffers}.items():
        if name not in present:
            continue
        dim_idx = slices.get(name)
        tensors[name] = t if dim_idx is None else t.index_select(dim_idx[0], dim_idx[1])
    loss = loss_fn(functional_call(view, tensors, (x,), strict=False), y)
    for name, (dim, idx) in slices.items():
        if name in buffers:
            buffers[name].index_copy_(dim, idx, tensors[name])
    return loss


def average_over_holders(grads: list[dict[str, torch.Tensor | None]], params: dict[str, nn.Parameter],
                         regions: dict[str, list[Region]]) -> dict[str, torch.Tensor]:
    """g_c = (1/k_c) sum_{i in S_c} g_{i,c} for every region; a holder without a gradient adds 0."""
    out = {}
    for name, p in params.items():
        avg = torch.zeros_like(p)
        for dim, start, stop, holders in regions[name]:
            acc = torch.zeros_like(_region(avg, dim, start, stop))
            for i in holders:
                if grads[i][name] is not None:
                    acc += _region(grads[i][name], dim, start, stop)
            _region(avg, dim, start, stop).copy_(acc / len(holders))
        out[name] = avg
    return out


def clip_by_global_norm(grads: dict[str, torch.Tensor], max_norm: float) -> float:
    """Scale every gradient by max_norm / (norm + 1e-6) when the global norm exceeds max_norm."""
    norm = float(sum(g.double().pow(2).sum() for g in grads.values()) ** 0.5)
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads.values():
            g.mul_(scale)
    return norm


def make_adamw(params: dict[str, nn.Parameter], cfg: Config) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay on >= 2-D tensors only, eps 1e-8, the run's betas."""
    t = cfg.train
    decay = [p for p in params.values() if p.dim() >= 2]
    rest = [p for p in params.values() if p.dim() < 2]
    groups = [g for g in ({"params": decay, "weight_decay": t.weight_decay},
                          {"params": rest, "weight_decay": 0.0}) if g["params"]]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=1e-8)


def worker_batch(data, cfg: Config, step: int, rank: int, world: int):
    """Worker ``rank``'s share of step ``step``'s global batch, as the trainer draws it."""
    if cfg.data.kind == "text":
        return data.train_batch(step, rank, world, cfg.train.batch_size, cfg.data.seq_len)
    return data.train_batch(step, rank, world, cfg.train.batch_size)


def exported_buffers(model: nn.Module, plan, buffers: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Persistent buffers of the exported model: shared ones from worker 0, a block's from its first
    holder, each neuron/channel group's slice from the group's first holder."""
    keep = set(model.state_dict()) - {n for n, _ in model.named_parameters(remove_duplicate=False)}
    out = {n: buffers[0][n].clone() for n in keep}
    for c, comp in enumerate(plan.components):
        src = buffers[int(plan.mask[:, c].nonzero()[0][0])]
        if comp.index is None:
            for name in out:
                if name.startswith(comp.name + "."):
                    out[name] = src[name].clone()
            continue
        for name, dim in zip(comp.buffers, comp.buffer_dims, strict=True):
            _region(out[name], dim, *comp.index).copy_(_region(src[name], dim, *comp.index))
    return out


def simulate(cfg: Config) -> Reference:
    """Train ``cfg`` (an SDP run config) for its steps with every worker simulated in this process."""
    world, regime = cfg.parallel.workers, cfg.sdp.regime
    data = build_data(cfg)
    model = build_model(cfg, data)
    model.train()
    plan = plan_from_config(cfg, model, world)
    params = dict(model.named_parameters())
    initial = {n: p.detach().clone() for n, p in params.items()}
    regions = param_regions(plan, model)
    buffers = [{n: b.clone() for n, b in model.named_buffers()} for _ in range(world)]
    opt = make_adamw(params, cfg)
    base_lrs = [g["lr"] for g in opt.param_groups]
    total, ref_losses = total_steps(cfg), []
    for step in range(total):
        scale = lr_at(step, cfg, total) / cfg.train.lr
        for g, base in zip(opt.param_groups, base_lrs, strict=True):
            g["lr"] = base * scale
        grads, step_losses = [], []
        for rank in range(world):
            x, y = worker_batch(data, cfg, step, rank, world)
            loss = worker_loss(model, plan, rank, regime, buffers[rank], x, y)
            got = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
            grads.append(dict(zip(params, got, strict=True)))
            step_losses.append(float(loss.detach()))
        avg = average_over_holders(grads, params, regions)
        if cfg.train.grad_clip:
            clip_by_global_norm(avg, cfg.train.grad_clip)
        for name, p in params.items():
            p.grad = avg[name]
        opt.step()
        opt.zero_grad(set_to_none=True)
        ref_losses.append(sum(step_losses) / world)
    final = {n: p.detach().clone() for n, p in params.items()}
    return Reference(final, exported_buffers(model, plan, buffers), ref_losses, plan, model, initial)


# ------------------------------------------------------------------------ byte accounting

def component_numel(model: nn.Module, comp) -> int:
    """Elements a component owns, from the model's tensor shapes (whole params or slices)."""
    total = 0
    for j, name in enumerate(comp.params):
        p = model.get_parameter(name)
        if comp.index is None:
            total += p.numel()
        else:
            total += p.numel() // p.shape[comp.dims[j]] * (comp.index[1] - comp.index[0])
    return total


def expected_comm_bytes(plan, model: nn.Module, rank: int, regime: str, grad_clip: float) -> int:
    """Bytes ``rank`` feeds into collectives in one step, by hand: fp32 gradients of every held
    component with k_c > 1 (its holder group's all-reduce), every shared gradient (all-worker
    all-reduce), one float64 scalar for the global clipping norm, and, in the backward regime, every
    component this rank broadcasts as its refresh root (the plan's policy, slimpar.sdp.roots; components
    every worker holds are never stale and are not refreshed)."""
    n = plan.world_size
    if n == 1:
        return 0
    numel = {c: component_numel(model, comp) for c, comp in enumerate(plan.components)}
    everything = sum(p.numel() for p in model.parameters())  # tied weights counted once
    shared = everything - sum(numel.values())
    held = [c for c in numel if plan.mask[rank, c]]
    grads = sum(numel[c] for c in held if plan.mask[:, c].sum() > 1) + shared
    stale = [c for c in numel if plan.mask[:, c].sum() < n]
    roots = refresh_roots(plan)
    refresh = sum(numel[c] for c in stale if roots[c] == rank) if regime == "backward" else 0
    return 4 * (grads + refresh) + (8 if grad_clip else 0)
