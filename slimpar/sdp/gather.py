"""Gather the full model from its holders (for evaluation, checkpoints and export).

Every parameter and buffer of the full model is taken from one holder: shared tensors from worker 0,
a block's tensors from its first holder, and each neuron/channel slice from the first holder of its
group. Either broadcast over the all-workers group (every rank ends with the full model) or sent point
to point to one rank only (the others hold nothing beyond their subnetwork: evaluation, where a rank
may fit its subnetwork but not the full model beside it). Tensors are visited in the skeleton's order,
the same on every rank, so the collectives (or the sends and receives of each pair) match.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from slimpar.sdp.apply import Subnet, meta_skeleton, unit_position  # noqa: F401  (meta_skeleton: re-exported)
from slimpar.sdp.plan import Plan


def materialize(skeleton: nn.Module, device: torch.device) -> nn.Module:
    """Allocate a copy of a meta skeleton on ``device``, restoring tied parameters."""
    first: dict[int, str] = {}
    ties: list[tuple[str, str]] = []
    for name, p in skeleton.named_parameters(remove_duplicate=False):
        if id(p) in first:
            ties.append((name, first[id(p)]))
        else:
            first[id(p)] = name
    full = copy.deepcopy(skeleton).to_empty(device=device)
    for name, src in ties:
        mod_path, _, attr = name.rpartition(".")
        setattr(full.get_submodule(mod_path) if mod_path else full, attr, full.get_parameter(src))
    return full


def _owner_of(plan: Plan) -> dict[str, list[tuple[int, tuple[int, int] | None, int]]]:
    """tensor name -> [(source worker, (start, stop) or None, dim)] in plan order."""
    owners: dict[str, list] = {}
    for c, comp in enumerate(plan.components):
        src = plan.holders(c)[0]
        for names, dims in ((comp.params, comp.dims), (comp.buffers, comp.buffer_dims)):
            for i, name in enumerate(names):
                dim = dims[i] if dims else 0
                owners.setdefault(name, []).append((src, comp.index, dim))
        if comp.index is None:  # a whole block: its buffers too (e.g. BatchNorm statistics)
            owners.setdefault(f"__module__{comp.name}", []).append((src, None, 0))
    return owners


def gather_full_model(local_tensors: dict[int, dict[str, torch.Tensor]], skeleton: nn.Module, plan: Plan,
                      subs: dict[int, Subnet], move, device: torch.device, receives: bool = True) -> nn.Module | None:
    """Materialise ``skeleton`` and fill it from the holders (collective over the SDP workers).

    ``local_tensors[w]`` are the unsharded parameters and buffers, by name, of each worker w that lives in
    this process; ``move(t, w)`` brings worker w's value of ``t`` to the receiving ranks (a broadcast to
    every rank, a send to one, a no-op when every worker lives here). ``receives``: this rank builds the
    model; otherwise it only hands ``move`` what it holds, and returns None."""
    full = materialize(skeleton, device) if receives else None
    owners = _owner_of(plan)
    block_src = {k[len("__module__"):]: v[0][0] for k, v in owners.items() if k.startswith("__module__")}
    model = full if full is not None else skeleton  # on a rank that only sends: the names, in the same order
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        target = tensor if full is not None else None
        with torch.no_grad():
            if name in owners:
                for src, index, dim in owners[name]:
                    _fill(target, name, src, index, dim, local_tensors, subs, move)
                continue
            src = next((s for prefix, s in block_src.items() if name.startswith(prefix + ".")), 0)
            _fill(target, name, src, None, 0, local_tensors, subs, move)
    return full


def _fill(target, name, src, index, dim, local_tensors, subs, move) -> None:
    mine = None
    if src in local_tensors:
        mine = local_tensors[src].get(name)
        if index is not None:
            local_dim, idx = subs[src].index_map[name]
            pos = _local_positions(idx, index)
            mine = mine.narrow(local_dim, pos[0], pos[1] - pos[0])
    if target is None:  # this rank only sends
        if mine is not None:
            move(mine.contiguous(), src)
        return
    view = target if index is None else target.narrow(dim, index[0], index[1] - index[0])
    if mine is not None:
        view.copy_(mine)
    buf = view.contiguous()
    move(buf, src)
    if buf is not view:  # a strided slice: received into a contiguous copy
        view.copy_(buf)


def _local_positions(idx: torch.Tensor, index: tuple[int, int]) -> tuple[int, int]:
    """Where the global units [start, stop) sit in a local index list (they are contiguous there)."""
    start = unit_position(idx, index[0])
    return start, start + index[1] - index[0]


@torch.no_grad()
def recalibrate_batchnorm(model: nn.Module, batches: list[torch.Tensor]) -> int:
    """Re-estimate every BatchNorm's running statistics of ``model`` on ``batches``; returns how many.

    A gathered full model never ran as a whole during SDP training: each BatchNorm's statistics were
    estimated by holders on their subnetworks, whose pre-norm activations sum over fewer channels
    (neuron level) or follow fewer blocks (block level). As for slimmable networks, the statistics are
    recomputed on the full model: reset, then a cumulative average (momentum None) over the batches
    in train mode, no gradients. Every worker passes the same batches, so no communication is needed.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms or not batches:
        return 0
    momenta = [m.momentum for m in norms]
    was_training = model.training
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average: every batch weighs the same
    model.train()
    for x in batches:
        model(x)
    for m, momentum in zip(norms, momenta, strict=True):
        m.momentum = momentum
    model.train(was_training)
    return len(norms)

