"""The one place slimpar creates process groups: sub-groups of any parent group, with one timeout.

Library code names the ranks of a group it wants *inside its parent group* (SDP worker w of a plan
run over a stage's replica group is the parent's group-rank w); :class:`GroupFactory` translates
them to global ranks and creates the groups.

Why every rank takes part: ``dist.new_group`` must be called by every rank of the default group,
in the same order (``use_local_synchronization`` names a group by how many groups the calling rank
made before, which differs between ranks that belong to different groups, so it can deadlock or
mismatch; ``split_group`` does not support gloo). :meth:`GroupFactory.create` is therefore a
collective over the default group: the ranks first swap the sets they want, then every rank creates
the union, sorted, in the same order. Only the
set of all ranks reuses an existing group (WORLD): a sub-group parent is not reused, since a rank
cannot know that every member of the set holds that very group.

Each set is created once per factory: the factory remembers every set it created, on every rank (members
keep the group, non-members a placeholder), and a later :meth:`GroupFactory.create` reuses it. The
memory agrees across ranks because every rank makes the same calls and sees the same union, so callers
that want the same groups (holder-sharded FSDP2 and the holder sync over the same holder sets) share one
factory instead of creating every group twice. A group is one communicator on each member; gloo connects
its members when it is created, NCCL with a device bound to the default group splits it from the world's
communicator (``ncclCommSplit``, a call on every rank), without one at its first collective, members only.

Communication phases: (1) one ``all_gather_object`` over the default group (a digest of the sets each
rank wants; where they differ, each distinct list is broadcast once: :func:`wanted_anywhere`); (2) one
``new_group`` per distinct set of global ranks not created before, on every rank, sorted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from datetime import timedelta

import torch.distributed as dist

GlobalRanks = tuple[int, ...]


def group_ranks(group: dist.ProcessGroup | None) -> list[int]:
    """Global ranks of ``group`` in group-rank order (the default group when None)."""
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


class GroupFactory:
    """Create sub-groups of ``parent`` named by group-local ranks (see the module docstring).

    ``timeout`` bounds every collective on the groups it creates (None: torch's default); it is the
    only place a group's timeout is set. ``made``: every set of global ranks this factory created (or
    took as WORLD), with its group on members and None elsewhere; ``new_groups`` counts ``new_group`` calls.
    """

    def __init__(self, parent: dist.ProcessGroup | None = None, timeout: timedelta | None = None):
        self.parent = dist.group.WORLD if parent is None else parent
        self.timeout = timeout
        self.ranks = group_ranks(parent)
        self.made: dict[GlobalRanks, dist.ProcessGroup | None] = {}
        self.new_groups = 0

    def to_global(self, local: Iterable[int]) -> GlobalRanks:
        return tuple(sorted(self.ranks[r] for r in local))

    def global_rank(self, local: int) -> int:
        return self.ranks[local]

    def create(self, local_sets: Sequence[Iterable[int]]) -> dict[tuple[int, ...], dist.ProcessGroup]:
        """Collective over the default group: a group for every set of parent-local ranks with more than one
        member; returns the groups this rank is in, keyed by the local set as given (sorted)."""
        wanted = {tuple(sorted(s)): self.to_global(s) for s in local_sets if len(set(s)) > 1}
        made = self.create_global(list(wanted.values()))
        return {local: made[g] for local, g in wanted.items() if g in made}

    def create_global(self, sets: Sequence[GlobalRanks]) -> dict[GlobalRanks, dist.ProcessGroup]:
        """Create groups of global ranks on every rank of the default group (those this factory has not
        created before); returns this rank's, old and new."""
        everyone = wanted_anywhere(sorted({tuple(sorted(s)) for s in sets}))  # ranks in other parents want others
        me, all_ranks = dist.get_rank(), tuple(range(dist.get_world_size()))
        for ranks in sorted(everyone - self.made.keys()):  # the same sets on every rank, in the same order
            if len(ranks) < 2:
                continue
            if ranks == all_ranks:
                group = dist.group.WORLD
            else:
                group = dist.new_group(list(ranks), timeout=self.timeout)
                self.new_groups += 1
            self.made[ranks] = group if me in ranks else None
        return {ranks: self.made[ranks] for ranks in everyone if me in ranks and len(ranks) > 1}


def wanted_anywhere(mine: list[GlobalRanks]) -> set[GlobalRanks]:
    """Collective over the default group: the union of the sets every rank passes. The ranks all-gather a
    digest of their lists (32 bytes each; the lists themselves, all-gathered, are world x sets x set size
    integers for every rank to unpickle: 9 M and 0.3-1.7 s at 1,024 workers), and each distinct list is broadcast
    once from the lowest rank with it, only where the ranks' lists differ (pipeline stages' replica groups)."""
    digest = hashlib.sha256(repr(mine).encode()).hexdigest()
    digests: list = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)
    if len(set(digests)) == 1:
        return set(mine)
    union: set[GlobalRanks] = set()
    for d in sorted(set(digests)):  # the same broadcasts in the same order on every rank
        box = [mine if d == digest else None]
        dist.broadcast_object_list(box, src=digests.index(d))
        union.update(tuple(s) for s in box[0])
    return union
