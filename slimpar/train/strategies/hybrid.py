"""SDP × MAPL: subnetwork data parallelism inside the stages of a compressed pipeline (docs/pipeline.md,
"Hybrid: SDP inside pipeline stages").

Layout: workers = P stages × R replicas (pipeline/groups.py), a 2-D mesh (dp × pp). Within stage s the R
replicas are the SDP workers: the stage's blocks are the components, planned over R workers with keep
``pipeline.sdp_keep`` (``sdp.plan_components``, cyclic or random by ``sdp.assignment``, seed
``train.seed`` + s), and each replica deletes the blocks it does not hold (``sdp.apply.apply_subnet``,
forward regime: a missing block is skipped, the residual stream passes through). Per step, after the
schedule:
  - each block's gradient is averaged over its holders, one flat all-reduce per holder set, on a
    sub-group of the stage's replica group (created on every rank, ``replica_subgroups``);
  - everything else of the stage (embedding, head, norms, codec halves) is averaged over the whole
    replica group as in pipeline × DDP; A and anchor tables then get their two-end sum as before.
The clip norm counts each block once (its first holder) and each other parameter once (replica 0), in
one all-reduce over the world. Evaluation and export first fill in the missing blocks from their first
holders (a broadcast in the replica group), then put the subnetwork back.

Python API: build a ``StageModule`` (``pipeline.build_stages``) on every rank, then
``StageSubnet(stage, plan, layout, groups)`` with ``plan = stage_plans(model, P, R, keep)[s]``;
call ``average(params)`` after the schedule. ``SubnetworkDataParallel(stage, plan, group=dp_group)`` does
not fit here: its holder groups are created with worker indices as global ranks and only by the
group's members, which deadlocks (or picks wrong ranks) when the DP group is not ranks 0..R−1.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from slimpar.pipeline.groups import PipelineGroups, PipelineLayout, layout_mesh, replica_subgroups
from slimpar.pipeline.split import StageModule, stage_ranges
from slimpar.sdp.apply import apply_subnet
from slimpar.sdp.components import model_components
from slimpar.sdp.plan import Plan, plan_components
from slimpar.train.strategies.pipeline import PipelineStrategy


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


class StageSubnet:
    """Replica ``layout.replica``'s subnetwork of its stage, and the gradient averaging that goes with it."""

    def __init__(self, stage: StageModule, plan: Plan, layout: PipelineLayout, groups: PipelineGroups,
                 subgroups: dict[tuple[int, ...], dist.ProcessGroup]):
        self.stage, self.plan, self.layout, self.groups = stage, plan, layout, groups
        self.me = layout.replica
        layers = stage.model.layers
        self.keys = list(layers.keys())  # model order, for putting missing blocks back
        self.skeletons = {c.name.rsplit(".", 1)[1]: _skeleton(layers[c.name.rsplit(".", 1)[1]])
                          for j, c in enumerate(plan.components) if not plan.mask[self.me, j]}
        block_params = {p for c in plan.components for p in c.params}
        shared = [n for n, _ in stage.named_parameters() if n not in block_params]
        self.sub = apply_subnet(stage, plan, self.me, shared, "forward")
        self.subgroups = subgroups
        self.block_ids = {id(pc.param) for pieces in self.sub.pieces.values() for pc in pieces}
        self.holder_bytes = self.shared_bytes = 0  # bytes fed into the last step's averaging

    def holder_sets(self) -> dict[tuple[int, ...], list[nn.Parameter]]:
        """Holder set -> this replica's parameters of the blocks with that set (model order)."""
        out: dict[tuple[int, ...], list[nn.Parameter]] = {}
        for c in sorted(self.sub.pieces):
            out.setdefault(self.plan.holders(c), []).extend(p.param for p in self.sub.pieces[c])
        return out

    def average(self, params: list[nn.Parameter]) -> None:
        """Blocks over their holders, the rest of ``params`` over all R replicas (one flat all-reduce each)."""
        self.holder_bytes = 0
        for hs, ps in sorted(self.holder_sets().items()):
            if len(hs) > 1:
                self.holder_bytes += _flat_mean([p for p in ps if p.requires_grad], self.subgroups[hs], len(hs))
        rest = [p for p in params if id(p) not in self.block_ids and p.grad is not None]
        r = self.layout.replicas
        self.shared_bytes = _flat_mean(rest, self.groups.replica, r) if r > 1 else 0

    def counted(self, p: nn.Parameter) -> bool:
        """Whether this rank counts ``p`` in the global clip norm: blocks at their first holder, the rest
        at replica 0."""
        if id(p) in self.block_ids:
            c = next(c for c, pcs in self.sub.pieces.items() if any(q.param is p for q in pcs))
            return self.plan.holders(c)[0] == self.me
        return self.me == 0

    @torch.no_grad()
    def check(self) -> int:
        """Raise unless every holder's copy of each block (and every replica's rest) is bit-identical; returns
        how many holder sets were compared."""
        sets = [(hs, ps) for hs, ps in sorted(self.holder_sets().items()) if len(hs) > 1]
        rest = [p for p in self.stage.parameters() if id(p) not in self.block_ids]
        if self.layout.replicas > 1:
            sets.append((tuple(range(self.layout.replicas)), rest))
        for hs, ps in sets:
            mine = torch.tensor([_fingerprint(ps)], dtype=torch.int64)
            got = [torch.empty_like(mine) for _ in hs]
            dist.all_gather(got, mine, group=self.subgroups[hs])
            if any(int(g) != int(mine) for g in got):
                raise RuntimeError(f"hybrid: stage {self.layout.stage}'s replicas {list(hs)} differ")
        return len(sets)

    @contextlib.contextmanager
    def full(self) -> Iterator[None]:
        """The full stage for the duration: missing blocks broadcast from their first holders (replica group)."""
        layers = self.stage.model.layers
        if not self.skeletons and self.layout.replicas == 1:
            yield
            return
        device = next(self.stage.parameters()).device
        filled = {}
        for j, c in enumerate(self.plan.components):  # same order on every replica
            key = c.name.rsplit(".", 1)[1]
            held = bool(self.plan.mask[self.me, j])
            if len(self.plan.holders(j)) == self.layout.replicas:
                continue  # everyone holds it
            block = layers[key] if held else self.skeletons[key].to_empty(device=device)
            src = self.layout.replica_ranks(self.layout.stage)[self.plan.holders(j)[0]]
            with torch.no_grad():
                for t in [*block.parameters(), *block.buffers()]:
                    dist.broadcast(t.data, src=src, group=self.groups.replica)
            if not held:
                filled[key] = block
        original = layers
        self.stage.model.layers = nn.ModuleDict({k: original[k] if k in original else filled[k] for k in self.keys})
        try:
            yield
        finally:
            self.stage.model.layers = original


def _skeleton(block: nn.Module) -> nn.Module:
    """A meta-device copy of ``block`` (no storage) to fill in at evaluation; an activation-checkpointing
    forward (an instance attribute bound to the original block) is dropped so the copy runs its own."""
    skel = copy.deepcopy(block)
    skel.__dict__.pop("forward", None)
    skel.__dict__.pop("_slimpar_ac", None)
    return skel.to("meta")


def _flat_mean(params: list[nn.Parameter], group: dist.ProcessGroup, k: int) -> int:
    """Average the gradients of ``params`` over ``group`` (k ranks) in one flat all-reduce; returns its bytes."""
    if not params:
        return 0
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    dist.all_reduce(flat, group=group)
    flat /= k
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n
    return flat.numel() * flat.element_size()


def _fingerprint(params: list[nn.Parameter]) -> int:
    h = hashlib.blake2b(digest_size=8)
    for p in params:
        t = p.detach().contiguous().cpu()
        h.update(f"{tuple(t.shape)}{t.dtype};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return int.from_bytes(h.digest(), "little", signed=True)


class HybridPipelineStrategy(PipelineStrategy):
    """``parallel.mode = "pipeline"`` with ``pipeline.dp = "sdp"``: a pipeline whose stage replicas run SDP."""

    def __init__(self, cfg, model, ctx):
        layout = PipelineLayout.of(cfg.pipeline.stages, ctx.world, ctx.rank)
        s = cfg.sdp
        self.plans = stage_plans(model, layout.stages, layout.replicas, cfg.pipeline.sdp_keep, s.assignment,
                                 cfg.train.seed, s.min_holders)
        super().__init__(cfg, model, ctx)  # builds this rank's stage and the pipeline and replica groups
        self.mesh = layout_mesh(layout, self.groups, ctx.device.type)
        sets = [p.distinct_holder_sets for p in self.plans]
        subgroups = replica_subgroups(layout, [list(x) for x in sets], self.groups, ctx.timeout)
        self.subnet = StageSubnet(self.stage, self.plans[layout.stage], layout, self.groups, subgroups)
        self.checks = self.rows_bytes = 0

    @property
    def plan(self) -> Plan:
        return self.plans[self.layout.stage]

    def _replica_average(self) -> None:
        self.subnet.average(self.parameters())

    def _owned(self) -> list[nn.Parameter]:
        """Counted once over the whole world: blocks at their first holder, the rest at replica 0."""
        return [p for p in super()._owned() if self.subnet.counted(p)]

    def _sum_pipeline(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self.ctx.device)
        dist.all_reduce(t, group=self.groups.world)  # every term counted on exactly one rank of the world
        return t.cpu()

    def _touched_rows(self) -> torch.Tensor:
        """As the pipeline's, and the bytes of its id-mask all-reduce in the replica group (sparse rows only)."""
        rows = super()._touched_rows()
        sparse = any(is_sparse for sync in self.syncs for _, _, is_sparse in sync.params)
        self.rows_bytes = 4 * self.stage.model.cfg.vocab_size if self.groups.replica is not None and sparse else 0
        return rows

    def end_of_step(self, step: int) -> None:
        k = self.cfg.sdp.check_every
        if k and (step + 1) % k == 0:
            self.subnet.check()
            self.checks += 1

    def extra_metrics(self) -> dict:
        return {**super().extra_metrics(), "hybrid_holder_bytes": self.subnet.holder_bytes,
                "hybrid_dp_bytes": self.subnet.shared_bytes, "hybrid_rows_bytes": self.rows_bytes,
                "hybrid_holder_groups": {",".join(map(str, hs)): g.group_name
                                         for hs, g in self.subnet.subgroups.items()}}

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
