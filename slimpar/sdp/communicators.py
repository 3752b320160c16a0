"""How many process groups SDP's holder sync creates, and how many each worker joins (pure functions of the plan).

The holder sync (:class:`~slimpar.sdp.comm.GroupComm`) has one process group per set of more than one worker
that communicates: each distinct holder set, the set of all workers (the shared parameters and the clip
norm), and in the backward regime each refresh set (a component's refresh root and its non-holders). Each
group is one communicator on each of its members, and every rank of the world takes part in creating every
group (``dist.new_group``; :mod:`slimpar.parallel.groups`), so the number created bounds start-up time and
the number joined bounds a rank's communicator memory (NCCL's buffers are per communicator).

With ``sdp.fsdp`` = F every set has one group per shard index and each rank joins one copy of each of its
worker's sets (plus its worker's FSDP2 group); holder-sharded FSDP2 reuses the holder groups (one factory).
Where the SDP group is the world, the all-worker set is the world's own group and is not created.
"""

from __future__ import annotations

import numpy as np

from slimpar.sdp.holders import holder_sets
from slimpar.sdp.plan import Plan

Sets = list[tuple[int, ...]]


def communicator_sets(plan: Plan, regime: str, refresh: dict[int, tuple[int, ...]] | None = None) -> Sets:
    """Every set of SDP workers with a process group of its own, sorted: the distinct holder sets and (backward
    regime) refresh sets of more than one worker, and all workers (``refresh``: precomputed refresh sets)."""
    n = plan.world_size
    everyone = {tuple(range(n))} if n > 1 else set()
    return sorted({tuple(s) for s in holder_sets(plan, regime, refresh) if len(s) > 1} | everyone)


def communicators_report(plan: Plan, regime: str, fsdp: int = 1, world_is_parent: bool = True,
                         refresh: dict[int, tuple[int, ...]] | None = None) -> dict:
    """The holder sync's process groups: ``created`` (``new_group`` calls on every rank: one per set and shard
    index, the all-worker set only where the SDP group is not the world) and ``per_worker`` (groups each
    worker joins: its sets, plus its FSDP2 group when F > 1), with their min, max and mean."""
    sets = communicator_sets(plan, regime, refresh)
    counts = np.zeros(plan.world_size, dtype=np.int64)
    for s in sets:
        counts[list(s)] += 1
    counts += 1 if fsdp > 1 else 0
    reuses_world = world_is_parent and fsdp == 1 and plan.world_size > 1
    created = (len(sets) - reuses_world) * fsdp + (plan.world_size if fsdp > 1 and plan.world_size > 1 else 0)
    return {"sets": len(sets), "fsdp": fsdp, "world_reused": reuses_world, "created": int(created),
            "per_worker": counts.tolist(),
            "per_worker_min": int(counts.min()), "per_worker_max": int(counts.max()),
            "per_worker_mean": float(counts.mean())}
