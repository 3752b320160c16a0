"""Process layout of a pipeline with data-parallel replicas: workers = P stages × R replicas.

Global rank g runs stage g % P of replica g // P. Every rank creates every group, in the same order
(torch requires ``new_group`` to be called collectively): the R pipeline groups (one per replica: the
P ranks that pass activations along) and the P replica groups (one per stage: the R ranks whose
gradients are averaged, DDP-style). With R = 1 the pipeline group is the run's WORLD group
and no replica group exists. ``layout_mesh`` views the same groups as a 2-D DeviceMesh (dp × pp). Groups
come from :class:`slimpar.parallel.groups.GroupFactory` (ranks of the run's group, one timeout); SDP's
holder groups inside a stage's replica group are made the same way (:mod:`slimpar.hybrid`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from slimpar.parallel.groups import GroupFactory


@dataclass(frozen=True)
class PipelineLayout:
    """Where a rank sits: P ``stages`` × R ``replicas``, global rank g runs stage g % P of replica g // P."""

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
    pipelines = [tuple(layout.pipeline_ranks(r)) for r in range(layout.replicas)]
    replicas = [tuple(layout.replica_ranks(s)) for s in range(layout.stages)]
    made = GroupFactory(world_group, timeout).create(pipelines + replicas)
    return PipelineGroups(made[pipelines[layout.replica]], made[replicas[layout.stage]], world_group)


def layout_mesh(layout: PipelineLayout, groups: PipelineGroups, device_type: str = "cpu") -> DeviceMesh | None:
    """The layout as a 2-D DeviceMesh with dims ("dp", "pp") over the groups already built (no new groups):
    ``mesh["dp"]`` is this stage's replica group, ``mesh["pp"]`` this replica's pipeline. None when R = 1."""
    if groups.replica is None:
        return None
    ranks = [[r * layout.stages + s for s in range(layout.stages)] for r in range(layout.replicas)]  # (R, S)
    return DeviceMesh.from_group([groups.replica, groups.pipeline], device_type, ranks, mesh_dim_names=("dp", "pp"))
