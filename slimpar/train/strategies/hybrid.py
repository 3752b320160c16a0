"""The trainer's adapter for SDP × pipeline (``parallel.mode = "pipeline"`` with ``pipeline.dp = "sdp"``).

The method itself is library code (:mod:`slimpar.hybrid`): a pipeline stage per rank, SDP over each
stage's replicas with the library's own holder sync. This adapter builds it from the run config and
reports it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from slimpar.hybrid import StageSDP, stage_plans
from slimpar.pipeline.groups import PipelineLayout, layout_mesh
from slimpar.sdp.plan import Plan
from slimpar.train.strategies.pipeline import PipelineStrategy


class HybridPipelineStrategy(PipelineStrategy):
    """``parallel.mode = "pipeline"`` with ``pipeline.dp = "sdp"``: a pipeline whose stage replicas run SDP."""

    def __init__(self, cfg, model, ctx, run):
        layout = PipelineLayout.of(cfg.pipeline.stages, ctx.world, ctx.rank)
        s = cfg.sdp
        self.plans = stage_plans(model, layout.stages, layout.replicas, cfg.pipeline.sdp_keep, s.assignment,
                                 cfg.train.seed, s.min_holders)
        super().__init__(cfg, model, ctx, run)  # builds this rank's stage and the pipeline and replica groups
        self.mesh = layout_mesh(layout, self.groups, ctx.device.type)
        self.subnet = StageSDP(self.stage, self.plans[layout.stage], self.groups.replica, cfg.pipeline.microbatches,
                               ctx.timeout)
        self.checks = self.rows_bytes = 0

    def _schedule_scales_grads(self) -> bool:
        return self.layout.replicas == 1  # otherwise the replicas' overlapped sync divides by M (StageSDP)

    @property
    def plan(self) -> Plan:
        return self.plans[self.layout.stage]

    def _replica_average(self) -> None:
        self.subnet.sync()

    def _owned(self) -> list[nn.Parameter]:
        """Counted once over the whole world: blocks at their first holder, the rest at replica 0."""
        return [p for p in super()._owned() if self.subnet.counted(p)]

    def _sum_pipeline(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self.ctx.device)
        dist.all_reduce(t, group=self.groups.world)  # every term counted on exactly one rank of the world
        return t  # stays on the device, as the pipeline's: the clip factors are applied there, without a wait

    def _touched_rows(self) -> torch.Tensor:
        """As the pipeline's, and the bytes of its id-mask all-reduce in the replica group (sparse rows only)."""
        rows = super()._touched_rows()
        sparse = any(is_sparse for sync in self.syncs for _, _, is_sparse in sync.params)
        self.rows_bytes = 4 * self.stage.model.cfg.vocab_size if self.groups.replica is not None and sparse else 0
        return rows

    def end_of_step(self, step: int) -> None:
        k = self.cfg.sdp.check_every
        if k and (step + 1) % k == 0:
            self.subnet.check_replicas()
            self.checks += 1

    def extra_metrics(self) -> dict:
        holder, everyone = self.subnet.bytes_per_step()
        groups = {",".join(map(str, hs)): g.group_name for (hs, _), g in self.subnet.comm.groups.items()}
        if self.groups.replica is not None:  # the id-mask all-reduce of the touched rows
            groups["replica"] = self.groups.replica.group_name
        return {**super().extra_metrics(), "hybrid_holder_bytes": holder, "hybrid_dp_bytes": everyone,
                "hybrid_rows_bytes": self.rows_bytes, "hybrid_holder_groups": groups}

    def evaluate(self, data, cfg) -> dict:
        with self.subnet.full():
            return super().evaluate(data, cfg)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        with self.subnet.full():
            return super().full_state_dict()

    def summary_extras(self) -> dict:
        p = self.plan
        out = super().summary_extras()
        out["hybrid"] = {"sdp_keep": self.cfg.pipeline.sdp_keep, "replicas": self.layout.replicas,
                         "replica_checks": self.checks,
                         "stage_masks": [pl.mask.tolist() for pl in self.plans],
                         "holders_per_component": [pl.holders_per_component for pl in self.plans],
                         "block_elements": [[c.elements for c in pl.components] for pl in self.plans],
                         "mesh": None if self.mesh is None else list(self.mesh.mesh_dim_names),
                         "spectral_gap": [pl.spectral_gap for pl in self.plans], "assignment": p.assignment}
        return out


def build_hybrid_strategy(cfg, model: nn.Module, ctx, run) -> HybridPipelineStrategy:
    """``pipeline.dp = "sdp"``: SDP among each stage's replicas."""
    return HybridPipelineStrategy(cfg, model, ctx, run)
