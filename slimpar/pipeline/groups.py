"""Process layout of a pipeline with data-parallel replicas: workers = P stages × R replicas.

Global rank g runs stage g % P of replica g // P. Every rank creates every group, in the same order
(torch requires ``new_group`` to be called collectively): first the R pipeline groups (one per
replica: the P ranks that pass activations along), then the P replica groups (one per stage: the R
ranks whose gradients are averaged, DDP-style). With R = 1 the pipeline group is the run's WORLD group
and no replica group exists. ``layout_mesh`` views the same groups as a 2-D DeviceMesh (dp × pp), and
``replica_subgroups`` adds sub-groups of each stage's replica group (e.g. SDP holder groups), again on
every rank in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh


@dataclass(frozen=True)
class PipelineLayout:
    stages: int  # P
    replicas: int  # R
    rank: int  # this process's global rank

    @property
    def stage(self) -> int:
        return self.rank % self.stages

    @property
    def replica(self) -> int:
        return self.rank // self.stages

    def pipeline_ranks(self, replica: int) -> list[int]:
        return [replica * self.stages + s for s in range(self.stages)]

    def replica_ranks(self, stage: int) -> list[int]:
        return [r * self.stages + stage for r in range(self.replicas)]

    def peers(self) -> dict[int, int]:
        """Stage index -> global rank, within this rank's pipeline."""
        return dict(enumerate(self.pipeline_ranks(self.replica)))

    @classmethod
    def of(cls, stages: int, world: int, rank: int) -> PipelineLayout:
        if world % stages:
            raise ValueError(f"{world} workers cannot hold whole pipelines of {stages} stages")
        return cls(stages, world // stages, rank)


@dataclass
class PipelineGroups:
    pipeline: dist.ProcessGroup  # this rank's pipeline (P ranks)
    replica: dist.ProcessGroup | None  # this rank's stage replicas (R ranks); None when R = 1
    world: dist.ProcessGroup  # every rank: loss, metrics and evaluation reductions


def build_groups(layout: PipelineLayout, world_group: dist.ProcessGroup,
                 timeout: timedelta | None = None) -> PipelineGroups:
    """Create the groups collectively (every rank, same order) and return this rank's.

    ``timeout`` bounds every collective and P2P message on the new groups (None: torch's default).
    """
    if layout.replicas == 1:
        return PipelineGroups(world_group, None, world_group)
    pipelines = [dist.new_group(layout.pipeline_ranks(r), timeout=timeout) for r in range(layout.replicas)]
    replicas = [dist.new_group(layout.replica_ranks(s), timeout=timeout) for s in range(layout.stages)]
    return PipelineGroups(pipelines[layout.replica], replicas[layout.stage], world_group)


def layout_mesh(layout: PipelineLayout, groups: PipelineGroups, device_type: str = "cpu") -> DeviceMesh | None:
    """The layout as a 2-D DeviceMesh with dims ("dp", "pp") over the groups already built (no new groups):
    ``mesh["dp"]`` is this stage's replica group, ``mesh["pp"]`` this replica's pipeline. None when R = 1."""
    if groups.replica is None:
        return None
    ranks = torch.arange(layout.stages * layout.replicas).view(layout.replicas, layout.stages)
    return DeviceMesh.from_group([groups.replica, groups.pipeline], device_type, ranks, mesh_dim_names=("dp", "pp"))


def replica_subgroups(layout: PipelineLayout, sets_by_stage: list[list[tuple[int, ...]]], groups: PipelineGroups,
                      timeout: timedelta | None = None) -> dict[tuple[int, ...], dist.ProcessGroup]:
    """Sub-groups of every stage's replica group, created collectively; returns this rank's stage's.

    ``sets_by_stage[s]`` lists sets of replica indices (0..R−1) of stage s; each is translated to global
    ranks (replica w of stage s is rank w·P + s). Sets of one replica need no group; the set of all R
    replicas is the stage's replica group itself. Every rank calls ``new_group`` for every stage's sets,
    in stage order and sorted within a stage, as torch requires. The result holds the sets this rank
    is in (and the set of all replicas).
    """
    everyone = tuple(range(layout.replicas))
    mine: dict[tuple[int, ...], dist.ProcessGroup] = {}
    if groups.replica is not None:
        mine[everyone] = groups.replica
    for s, sets in enumerate(sets_by_stage):
        for hs in sorted({tuple(sorted(h)) for h in sets if 1 < len(h) < layout.replicas}):
            ranks = [layout.replica_ranks(s)[w] for w in hs]
            g = dist.new_group(ranks, timeout=timeout)
            if s == layout.stage and layout.replica in hs:  # others get a non-member placeholder
                mine[hs] = g
    return mine
