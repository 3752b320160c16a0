"""SDP × pipeline: subnetwork data parallelism over the replicas of each pipeline stage.

Layout: workers = P stages × R replicas (:mod:`slimpar.pipeline.groups`). Within stage s the R replicas are
the SDP workers: the stage's blocks are the components, planned over R workers (:func:`stage_plans`, seed
+ s), and each replica deletes the blocks it does not hold (forward regime: a missing block is skipped,
the residual stream passes through). The SDP engine is the library's own
(:class:`~slimpar.sdp.holders.HolderSync` on :class:`~slimpar.sdp.comm.GroupComm` over the stage's replica
group), so the hybrid's gradients are averaged exactly like SDP's.

Communication phases, per step, after the pipeline schedule (``sync()``):

1. during the schedule's backward: each block's gradient is averaged over its holders, on sub-groups of the
   stage's replica group, everything else of the stage (embedding, head, norms, codec halves) over all R
   replicas, as in pipeline × DDP; bucketed by holder set and overlapped with backward. A gradient is final
   after the M-th micro-batch's backward, and enters its bucket divided by M: the caller builds its schedule
   with ``scale_grads=False`` (for R > 1), as the all-reduce may already be running when the schedule ends.
   ``sync()`` (after the schedule) waits and writes the averages back;
2. the clip norm counts each block once (its first holder) and each other parameter once (replica 0)
   (:meth:`StageSDP.counted`), summed by the caller over the world;
3. ``check_replicas()``: holders compare fingerprints; ``full()``: the missing blocks are broadcast from
   their first holders in the replica group for evaluation and export, then the subnetwork is put back.

Set-up is collective over the world: every rank builds its stage's ``StageSDP`` at the same point (the
holder groups of all stages are created on every rank, :class:`slimpar.parallel.groups.GroupFactory`).

    plans = stage_plans(model, P, R, keep)            # pure: every rank computes every stage's plan
    stage = build_stages(model, ...)[s]               # slimpar.pipeline
    sdp = StageSDP(stage, plans[s], replica_group, M)  # replica_group: this stage's R ranks (None if R = 1)
    schedule = Schedule1F1B(pp_stage, M, loss_fn, scale_grads=replica_group is None)
    schedule.step(...); sdp.sync()                     # then the pipeline's shared-parameter sync, clip, step
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from slimpar.pipeline.split import StageModule, stage_ranges
from slimpar.sdp.apply import apply_subnet
from slimpar.sdp.comm import GroupComm, LocalComm
from slimpar.sdp.components import model_components
from slimpar.sdp.holders import HolderSync
from slimpar.sdp.plan import Plan, plan_components


def stage_plans(model: nn.Module, stages: int, replicas: int, keep: float, assignment: str = "cyclic",
                seed: int = 0, min_holders: int = 1) -> list[Plan]:
    """One block plan per stage over its R replicas, components named as in a ``StageModule``
    (``model.layers.i``). Pure: every rank computes every stage's plan (the groups need them all).
    One replica holds everything (keep is forced to 1: SDP with one worker is plain training)."""
    comps, _, _ = model_components(model, "block")
    by_name = {c.name: c for c in comps}
    plans = []
    for s, blocks in enumerate(stage_ranges(len(model.layers), stages)):
        mine = [_renamed(by_name[f"layers.{i}"]) for i in blocks if f"layers.{i}" in by_name]
        plans.append(plan_components(mine, 0, replicas, 1.0 if replicas == 1 else keep, min_holders=min_holders,
                                     assignment=assignment, seed=seed + s))
    return plans


def _renamed(c):
    return dataclasses.replace(c, name=f"model.{c.name}", params=tuple(f"model.{p}" for p in c.params),
                               buffers=tuple(f"model.{b}" for b in c.buffers))


class StageSDP:
    """This replica's subnetwork of its pipeline stage, and SDP's synchronisation over the stage's replicas."""

    def __init__(self, stage: StageModule, plan: Plan, replica_group: dist.ProcessGroup | None,
                 microbatches: int = 1, timeout: timedelta | None = None, bucket_mb: float = 25.0):
        self.stage, self.plan, self.group = stage, plan, replica_group
        self.replicas = plan.world_size
        self.me = dist.get_rank(replica_group) if replica_group is not None else 0
        layers = stage.model.layers
        self.keys = list(layers.keys())  # model order, for putting missing blocks back
        self.skeletons = {_key(c): _skeleton(layers[_key(c)])
                          for j, c in enumerate(plan.components) if not plan.mask[self.me, j]}
        block_params = {p for c in plan.components for p in c.params}
        shared = [n for n, _ in stage.named_parameters() if n not in block_params]
        self.sub = apply_subnet(stage, plan, self.me, shared, "forward")
        comm = (GroupComm(plan.distinct_holder_sets, self.replicas, replica_group, timeout=timeout)
                if replica_group is not None else LocalComm(1))
        self.comm = comm
        self.holders = HolderSync({self.me: (stage, self.sub)}, plan, comm, "forward", bucket_mb, overlap=True,
                                  accumulations=microbatches)
        self.block_ids = {id(pc.param): c for c, pieces in self.sub.pieces.items() for pc in pieces}

    def sync(self) -> None:
        """Average: blocks over their holders, the rest of the stage over all R replicas (after the schedule)."""
        self.holders.sync()

    def bytes_per_step(self) -> tuple[int, int]:
        """(block bytes, other bytes) this replica feeds into one step's averaging: the blocks' into their holder
        sets (a block every replica holds shares the all-replica buckets), the rest over all R replicas."""
        blocks = rest = 0
        for b in self.holders.grad_sync.buckets if self.holders.grad_sync else []:
            for p in b.pieces[self.me]:
                n = p.numel * p.param.element_size()
                if id(p.param) in self.block_ids:
                    blocks += n
                else:
                    rest += n
        return blocks, rest

    def counted(self, p: nn.Parameter) -> bool:
        """Whether this rank counts ``p`` in the global clip norm: blocks at their first holder, the rest
        at replica 0."""
        c = self.block_ids.get(id(p))
        return self.me == 0 if c is None else self.plan.holders(c)[0] == self.me

    def check_replicas(self) -> None:
        """Raise unless every holder's copy of each block (and every replica's rest) is bit-identical."""
        self.holders.check_replicas()

    @contextlib.contextmanager
    def full(self) -> Iterator[None]:
        """The full stage for the duration: missing blocks broadcast from their first holders (replica group)."""
        layers = self.stage.model.layers
        if not self.skeletons and self.replicas == 1:
            yield
            return
        device = next(self.stage.parameters()).device
        filled = {}
        for j, c in enumerate(self.plan.components):  # same order on every replica
            held = bool(self.plan.mask[self.me, j])
            if len(self.plan.holders(j)) == self.replicas:
                continue  # everyone holds it
            block = layers[_key(c)] if held else self.skeletons[_key(c)].to_empty(device=device)
            with torch.no_grad():
                for t in [*block.parameters(), *block.buffers()]:
                    self.comm.broadcast_from(t.data, self.plan.holders(j)[0])
            if not held:
                filled[_key(c)] = block
        original = layers
        self.stage.model.layers = nn.ModuleDict({k: original[k] if k in original else filled[k] for k in self.keys})
        try:
            yield
        finally:
            self.stage.model.layers = original


def _key(c) -> str:
    return c.name.rsplit(".", 1)[1]


def _skeleton(block: nn.Module) -> nn.Module:
    """A meta-device copy of ``block`` (no storage) to fill in at evaluation; an activation-checkpointing
    forward (an instance attribute bound to the original block) is dropped so the copy runs its own."""
    skel = copy.deepcopy(block)
    skel.__dict__.pop("forward", None)
    skel.__dict__.pop("_slimpar_ac", None)
    return skel.to("meta")
