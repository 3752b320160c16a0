"""SDP + FSDP2 with every block sharded over its own holder group.

Each block held by k > 1 workers is ``fully_shard``-ed over the process group of exactly its holders,
so FSDP2's reduce-scatter (which averages over the group) *is* holder-group averaging, and each
holder keeps 1/k of the block's parameters, gradients and optimizer state. Shared parameters are
sharded over all workers by the root. A block held by one worker stays whole and is left out of the
root's sharding (its gradient is never communicated). Per rank, static memory then matches FSDP2
over all workers while activations and all-gathers scale with the blocks a worker holds.

Communication phases: FSDP2 all-gathers a held block's shards within its holder group before its
forward and backward and reduce-scatters its gradient within the same group; the root does the same
for the shared parameters over all workers. The holder groups are sub-groups of the SDP group (any
group), created on every rank in the same order by :class:`slimpar.parallel.groups.GroupFactory`; pass the
same factory to ``SubnetworkDataParallel(groups=...)`` and its holder sync reuses them (one group per set).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from slimpar.parallel.groups import GroupFactory
from slimpar.parallel.precision import fsdp_kwargs
from slimpar.sdp.plan import Plan


def shard_over_holders(model: nn.Module, plan: Plan, rank: int, device: torch.device,
                       timeout: timedelta | None = None, group: dist.ProcessGroup | None = None,
                       mp_policy=None, factory: GroupFactory | None = None) -> None:
    """FSDP2-shard each held block over its holder group (worker ``rank`` of the SDP ``group``, default the
    world); ``timeout`` bounds those groups' collectives; ``mp_policy``: FSDP2's ``MixedPrecisionPolicy``;
    ``factory``: the :class:`GroupFactory` over ``group`` to create the groups with (and remember them)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    groups = (factory if factory is not None else GroupFactory(group, timeout)).create(plan.distinct_holder_sets)
    meshes = {hs: DeviceMesh.from_group(g, device.type) for hs, g in groups.items()}
    ignored: set[nn.Parameter] = set()
    sharded: list[tuple[tuple[int, ...], nn.Module]] = []
    for c, comp in enumerate(plan.components):
        if comp.index is not None:
            raise ValueError("sdp.holder_shard shards whole blocks; use --sdp.level block")
        if not plan.mask[rank, c]:
            continue
        block = model.get_submodule(comp.name)
        holders = plan.holders(c)
        if len(holders) > 1:
            fully_shard(block, mesh=meshes[holders], **fsdp_kwargs(mp_policy))
            sharded.append((holders, block))
        else:
            ignored.update(block.parameters())
    world = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, device.type)
    fully_shard(model, mesh=world, ignored_params=ignored or None, **fsdp_kwargs(mp_policy))
    _prefetch_within_groups(model, sharded)


def _prefetch_within_groups(model: nn.Module, sharded: list[tuple[tuple[int, ...], nn.Module]]) -> None:
    """FSDP2 by default prefetches, in backward, the module that ran just before in forward, which here
    may belong to another holder group: members of two groups would then wait on each other. Each block
    instead prefetches the previous block of its own group (or nothing: a module "prefetching" itself is
    a no-op), so every group's collectives follow block order on all its members."""
    last: dict[tuple[int, ...], nn.Module] = {}
    for holders, block in sharded:
        block.set_modules_to_backward_prefetch([last[holders]] if holders in last else [block])
        last[holders] = block
    model.set_modules_to_backward_prefetch([model])
