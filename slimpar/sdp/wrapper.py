"""``SubnetworkDataParallel``: the user-facing SDP wrapper (DDP-shaped).

Each worker holds and trains only its subnetwork (docs/methods.md, 'Subnetwork data parallelism (SDP)').
The wrapper is two parts, usable apart: :func:`~slimpar.sdp.apply.apply_subnet` cuts the worker's
subnetwork out of the full model, and :class:`~slimpar.sdp.holders.HolderSync` does all of SDP's
communication over the given process group, which may be any sub-group (a pipeline stage's replicas, one
dimension of a mesh). To add activation checkpointing or FSDP2, apply them from outside between the two: cut
with ``apply_subnet``, parallelize, then pass the ``subnet`` here; the sync binds to the module's parameters as
they are then.

Communication phases (details in :mod:`slimpar.sdp.holders`):

1. construction (collective over the default group): one process group per distinct holder set
   (backward regime: and per refresh set, its roots computed once), created on every rank in the same
   order (:class:`slimpar.parallel.groups.GroupFactory`; with ``groups``, sets that factory created
   already are reused); no parameters are sent (the model is built from the same seed everywhere);
2. every step, during backward: holder-set averaging of gradients, bucketed and overlapped with
   backward; ``sync()`` waits for it;
3. gradient clipping: one scalar all-reduce over the group;
4. backward regime, after the optimizer step: ``refresh()`` broadcasts stale components;
5. ``check_replicas()`` compares fingerprints among holders; ``gather_full_model()`` broadcasts every
   component from one holder (or, with ``dst``, sends it to that worker only).

Like DDP, the wrapper owns its sync: once it is dropped, its gradient hooks come off the parameters and it is
freed at once with its hold on the holder groups (not at interpreter exit), and the module trains on alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from slimpar.parallel.groups import GroupFactory
from slimpar.sdp.apply import Subnet, apply_subnet
from slimpar.sdp.comm import GroupComm, LocalComm
from slimpar.sdp.holders import HolderSync, holder_sets, refresh_sets
from slimpar.sdp.plan import Plan


class SubnetworkDataParallel(nn.Module):
    """Wrap a full single-device model; afterwards it holds only this rank's subnetwork.

    Args:
        module: the full model (identical on every rank, e.g. built from the same seed), or, with
            ``subnet``, the subnetwork already cut (and parallelized) from it.
        plan: the mask plan (``slimpar.sdp.plan_blocks`` / ``plan_neurons``); worker i = group rank i // fsdp.
        regime: "forward" (run the subnetwork) or "backward" (full forward, masked gradients).
        group: the group of all SDP workers, any sub-group of the world (default: WORLD when
            torch.distributed is initialized, else a single process with no communication).
        subnet: what ``apply_subnet`` returned when the caller cut the subnetwork itself (its regime wins).
        fsdp: ranks per SDP worker (FSDP2 applied by the caller over each worker's ranks).
        fsdp_does_averaging: holder-sharded FSDP2 (:mod:`slimpar.sdp.holder_fsdp`) averages gradients itself.
        bucket_mb: bucket size for gradient all-reduces; ``overlap``: launch them during backward.
        refresh_every: backward regime: refresh non-held blocks every T steps.
        timeout: bound on every collective of the holder groups.
        groups: the :class:`GroupFactory` over ``group`` that created the caller's groups (holder-sharded
            FSDP2's): the holder sync reuses them instead of creating every holder group a second time.
        reduce_dtype: dtype of the holder-group gradient sums (default fp32, also for bf16 parameters;
            None: the parameters' own dtype).
    """

    def __init__(self, module: nn.Module, plan: Plan, regime: str = "forward",
                 group: dist.ProcessGroup | None = None, bucket_mb: float = 25.0, refresh_every: int = 1,
                 overlap: bool = True, subnet: Subnet | None = None, fsdp: int = 1,
                 fsdp_does_averaging: bool = False, timeout: timedelta | None = None,
                 reduce_dtype: torch.dtype | None = torch.float32, groups: GroupFactory | None = None):
        super().__init__()
        if group is None and dist.is_initialized():
            group = dist.group.WORLD
        grank = dist.get_rank(group) if group is not None else 0
        world = dist.get_world_size(group) if group is not None else 1
        if plan.world_size * fsdp != world:
            raise ValueError(f"the plan is for {plan.world_size} workers x {fsdp} FSDP shards; the group has {world}")
        regime = subnet.regime if subnet is not None else regime
        if fsdp > 1 and regime != "forward":
            raise ValueError("SDP with FSDP2 shards forward-masked subnetworks (regime='forward')")
        self.plan, self.regime, self.group, self.fsdp = plan, regime, group, fsdp
        self.rank, self.shard = divmod(grank, fsdp)  # SDP worker index and FSDP shard index
        if subnet is None:
            subnet = apply_subnet(module, plan, self.rank, regime=regime)
        self.sub: Subnet = subnet
        self.skeleton = [subnet.skeleton]  # a list: not a child module
        self.module = module
        refresh = refresh_sets(plan) if regime == "backward" else {}  # once: its roots are a greedy search
        comm = (GroupComm(holder_sets(plan, regime, refresh), plan.world_size, group, fsdp, timeout, groups)
                if group is not None else LocalComm(1))
        self.holders = HolderSync({self.rank: (module, subnet)}, plan, comm, regime, bucket_mb,
                                  overlap and fsdp == 1, refresh_every, fsdp_does_averaging,
                                  reduce_dtype=reduce_dtype, refresh=refresh)

    @property
    def grad_sync(self):
        return self.holders.grad_sync

    @property
    def last_drift(self) -> float:
        return self.holders.last_drift

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def sync(self) -> None:
        """Finish holder-group averaging (call after backward, before the optimizer step)."""
        self.holders.sync()

    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (gradient accumulation); the next synced backward averages."""
        return self.holders.no_sync()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the norm of the full model's averaged gradient (identical on every worker)."""
        return self.holders.clip_grad_norm_(max_norm)

    def refresh(self) -> None:
        """Backward regime: bring non-held components up to date from their holders."""
        self.holders.refresh()

    def check_replicas(self) -> None:
        """Raise, naming the component, unless all holders' copies are bit-identical."""
        self.holders.check_replicas()

    def gather_full_model(self, device: torch.device | str | None = None, rescale: str = "none",
                          dst: int | None = None) -> nn.Module | None:
        """The full model on ``device`` (default: the module's), each component taken from one holder
        (collective: every rank calls). With ``dst``, only worker ``dst`` gets it (the others return None and
        hold nothing beyond their subnetwork: evaluation on one rank)."""
        return self.holders.gather_full_model(self.skeleton[0], device, rescale, dst)
