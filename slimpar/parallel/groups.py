"""The one place slimpar creates process groups: sub-groups of any parent group, with one timeout.

Library code names the ranks of a group it wants *inside its parent group* (SDP worker w of a plan
run over a stage's replica group is the parent's group-rank w); :class:`GroupFactory` translates
them to global ranks and creates the groups.

Why every rank takes part: ``dist.new_group`` must be called by every rank of the default group,
in the same order (``use_local_synchronization`` names a group by how many groups the calling rank
made before, which differs between ranks that belong to different groups, so it can deadlock or
mismatch; ``split_group`` does not support gloo). :meth:`GroupFactory.create` is therefore a
collective over the default group: the ranks first swap the sets they want (one
``all_gather_object``), then every rank creates the union, sorted, in the same order. Only the
set of all ranks reuses an existing group (WORLD): a sub-group parent is not reused, since a rank
cannot know that every member of the set holds that very group.

Communication phases: (1) one ``all_gather_object`` over the default group (the sets each rank
wants); (2) one ``new_group`` per distinct set of global ranks, on every rank, sorted.
"""

from __future__ import annotations

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
    only place a group's timeout is set.
    """

    def __init__(self, parent: dist.ProcessGroup | None = None, timeout: timedelta | None = None):
        self.parent = dist.group.WORLD if parent is None else parent
        self.timeout = timeout
        self.ranks = group_ranks(parent)

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
        """Create groups of global ranks on every rank of the default group; returns this rank's."""
        world = dist.get_world_size()
        lists: list = [None] * world
        dist.all_gather_object(lists, sorted({tuple(sorted(s)) for s in sets}))  # ranks in other parents want others
        everyone = {tuple(s) for part in lists for s in part}
        me, all_ranks = dist.get_rank(), tuple(range(world))
        out: dict[GlobalRanks, dist.ProcessGroup] = {}
        for ranks in sorted(everyone):
            if len(ranks) < 2:
                continue
            group = dist.group.WORLD if ranks == all_ranks else dist.new_group(list(ranks), timeout=self.timeout)
            if me in ranks:
                out[ranks] = group
        return out
