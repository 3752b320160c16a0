"""What one step of a candidate asks of each worker: its FLOPs (forward, backward) and its traffic.

FLOPs per token follow slimpar/parallel/flops.py (6 per parameter in a matrix product, attention's
12 · d · T per layer; the embedding lookup is free). Forward is a third, backward two thirds; activation
checkpointing runs the forward again inside the backward. An SDP worker in the forward regime runs only
its subnetwork: the blocks it holds cost their share; in the backward regime the forward is the full model's,
and of the backward the input gradients (half of it) are the full model's and the weight gradients (the
other half) only the held blocks'. A pipeline stage costs its blocks, and the last stage the head.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from slimpar.config import Config
from slimpar.plan.cluster import Cluster
from slimpar.plan.shape import Shape, shape_of
from slimpar.plan.traffic import Boundary, Load, Traffic, finish, new_traffic


@dataclass
class Workload:
    """Per worker: forward and backward FLOPs of the slowest worker; pipelines: per stage and microbatch."""

    fwd: float = 0.0
    bwd: float = 0.0
    stage_fwd: list[float] = field(default_factory=list)  # per microbatch
    stage_bwd: list[float] = field(default_factory=list)
    microbatches: int = 1
    traffic: Traffic | None = None


def workload(cfg: Config, cluster: Cluster) -> Workload:
    """FLOPs and traffic of one step of ``cfg`` on ``cluster`` (``cfg.parallel.workers`` = its workers): each
    mode's cost model (:data:`_WORKLOADS`)."""
    tokens = cfg.train.batch_size * cfg.data.seq_len
    return _WORKLOADS[cfg.parallel.mode](cfg, cluster, shape_of(cfg), tokens, cfg.train.activation_checkpointing)


def _data_parallel(traffic: Callable) -> Callable:
    """The workload of a data-parallel mode: every worker computes its share of the tokens through the full
    model, then ``traffic(cfg, shape, workload, traffic, tokens per worker)`` adds the mode's communication (and
    corrects the compute where the mode runs less of the model)."""
    def build(cfg: Config, cluster: Cluster, s: Shape, tokens: int, ac: bool) -> Workload:
        per_worker = tokens / cfg.parallel.workers
        full = s.flops_per_token * per_worker
        w, t = Workload(fwd=full / 3, bwd=2 * full / 3), new_traffic(cluster)
        traffic(cfg, s, w, t, per_worker)
        if ac:
            w.bwd += w.fwd
        w.traffic = finish(t, Load(cluster))
        return w

    return build


def _ddp(cfg: Config, s: Shape, w: Workload, t: Traffic, per_worker: float) -> None:
    grads = s.params * 4  # fp32 gradients
    t.overlap.all_reduce(list(range(cfg.parallel.workers)), grads, buckets(grads))


def _fsdp(cfg: Config, s: Shape, w: Workload, t: Traffic, per_worker: float) -> None:
    """One unit per block and the root: gathered in the forward, the blocks again in the backward."""
    ranks = list(range(cfg.parallel.workers))
    t.gather.gather(ranks, s.params * _compute_bytes(cfg), s.layers + 1)
    t.overlap.gather(ranks, s.layers * s.block_params * _compute_bytes(cfg), s.layers)
    t.overlap.reduce_scatter(ranks, s.params * 4, s.layers + 1)


def _sdp_step(cfg: Config, s: Shape, w: Workload, t: Traffic, per_worker: float) -> None:
    """A forward-regime worker computes its subnetwork; the backward regime runs the full forward."""
    full = w.fwd * 3
    share = _sdp(cfg, t)
    subnet = full - s.layers * s.block_flops * per_worker * (1 - share)
    if cfg.sdp.regime == "forward":
        w.fwd, w.bwd = subnet / 3, 2 * subnet / 3
    else:
        w.bwd = full / 3 + subnet / 3


def _alone(*_) -> None:
    """One worker: no communication."""


BUCKET_BYTES = 25 * 1024**2  # DDP's bucket_cap_mb, and SDP's holder buckets


def buckets(nbytes: float) -> int:
    """Collectives a bucketed all-reduce of ``nbytes`` issues."""
    return max(1, math.ceil(nbytes / BUCKET_BYTES))


def _compute_bytes(cfg: Config) -> int:
    return 2 if cfg.train.dtype == "bf16" else 4


def _sdp(cfg: Config, t: Traffic) -> float:
    """SDP's traffic into ``t``; returns the largest share of the maskable blocks' bytes a worker holds."""
    from slimpar.sdp.holders import refresh_sets
    from slimpar.train.run_plan import run_plan

    plan, f = run_plan(cfg).sdp, max(cfg.sdp.fsdp, 1)
    n = plan.world_size
    grad = 2 if cfg.sdp.reduce_dtype == "bf16" else 4

    def ranks(replicas, shard: int) -> list[int]:
        return [i * f + shard for i in replicas]

    per_set: dict[tuple[int, ...], float] = defaultdict(float)  # holder set -> gradient bytes (one bucket list)
    for c, holders in zip(plan.components, plan.holder_sets(), strict=True):
        per_set[holders] += c.elements * grad / f
    for shard in range(f):
        for holders, nbytes in per_set.items():
            t.overlap.all_reduce(ranks(holders, shard), nbytes, buckets(nbytes))
        shared = plan.shared_numel * grad / f
        t.overlap.all_reduce(ranks(range(n), shard), shared, buckets(shared))
        if cfg.sdp.regime == "backward":
            for c, members in refresh_sets(plan).items():
                numel = plan.components[c].elements
                t.exposed.chain(ranks(members, shard), numel * 4 / f / max(cfg.sdp.refresh_every, 1))
    if f > 1:
        for i in range(n):
            group = list(range(i * f, (i + 1) * f))
            held, units = plan.bytes_per_worker[i] // 4, int(plan.mask[i].sum())
            t.gather.gather(group, held * _compute_bytes(cfg), units + 1)
            t.overlap.gather(group, (held - plan.shared_numel) * _compute_bytes(cfg), units)  # blocks again, backward
            t.overlap.reduce_scatter(group, held * 4, units + 1)
    return max(plan.keep_bytes_per_worker)


def _pipeline(cfg: Config, cluster: Cluster, s: Shape, tokens: int, ac: bool) -> Workload:
    from slimpar.pipeline.budget import steady_bytes
    from slimpar.pipeline.split import stage_ranges
    from slimpar.train.run_plan import run_plan
    from slimpar.train.strategies.pipeline_specs import step_shape

    p = cfg.pipeline.stages
    replicas = cfg.parallel.workers // p
    m = cfg.pipeline.microbatches
    mb_tokens = tokens / replicas / m
    w = Workload(microbatches=m)
    blocks = [len(r) for r in stage_ranges(s.layers, p)]
    for i, b in enumerate(blocks):
        fl = (b * s.block_flops + (s.head_flops if i == p - 1 else 0)) * mb_tokens
        w.stage_fwd.append(fl / 3)
        w.stage_bwd.append(2 * fl / 3 + (fl / 3 if ac else 0.0))
    t, bounds = new_traffic(cluster), Load(cluster)
    specs = run_plan(cfg, s.vocab).codecs if p > 1 else []
    shape = step_shape(cfg)
    for rep in range(replicas):
        for i, spec in enumerate(specs):
            a, b = rep * p + i, rep * p + i + 1
            sent = steady_bytes(spec, shape)
            bounds.edge(a, b, sent["fwd"])
            bounds.edge(b, a, sent["bwd"])
            if rep == 0:
                same = cluster.node_of(a) == cluster.node_of(b)
                t.boundaries.append(Boundary(a, sent["fwd"], sent["bwd"],
                                             cluster.intra_gbps if same else cluster.inter_gbps))
    stage_params = [b * s.block_params for b in blocks]
    stage_params[0] += s.vocab * s.dim if not cfg.model.tie_embeddings or p == 1 else 0
    stage_params[-1] += s.vocab * s.dim + s.dim
    if cfg.pipeline.dp == "sdp" and replicas > 1:
        _stage_sdp(cfg, t, p, replicas, stage_params, blocks, s.block_params)
    else:
        for i in range(p):
            t.exposed.all_reduce([r * p + i for r in range(replicas)], stage_params[i] * 4,
                                 buckets(stage_params[i] * 4))
    if cfg.model.tie_embeddings and p > 1:  # the embedding's rows of the step's ids (at most), the head's all
        elem = {"fp32": 4, "bf16": 2, "int8": 1}[cfg.pipeline.tied_sync_dtype]
        rows = min(tokens // replicas, s.vocab)
        for rep in range(replicas):
            a, b = rep * p, rep * p + p - 1
            t.exposed.edge(a, b, rows * s.dim * elem)
            t.exposed.edge(b, a, s.vocab * s.dim * elem)
    w.traffic = finish(t, bounds)
    return w


def _stage_sdp(cfg: Config, t: Traffic, p: int, replicas: int, stage_params: list[int], blocks: list[int],
               block_params: int) -> None:
    """The hybrid's replica sync (slimpar.hybrid.stage_sdp): each stage's blocks among their holders, during
    the backward; the rest of the stage (embedding, head, norms) over all its replicas."""
    from slimpar.hybrid.stage_sdp import stage_plans
    from slimpar.train.run_plan import run_plan

    plans = stage_plans(run_plan(cfg).meta_model, p, replicas, cfg.pipeline.sdp_keep, seed=cfg.train.seed)
    for i, plan in enumerate(plans):
        per_set: dict[tuple[int, ...], float] = defaultdict(float)
        for c, holders in zip(plan.components, plan.holder_sets(), strict=True):
            per_set[holders] += c.elements * 4
        for holders, nbytes in per_set.items():
            t.overlap.all_reduce([h * p + i for h in holders], nbytes, buckets(nbytes))
        rest = (stage_params[i] - blocks[i] * block_params) * 4
        t.overlap.all_reduce([r * p + i for r in range(replicas)], rest, buckets(rest))


# each mode's cost model (pipelines: per stage and microbatch)
_WORKLOADS = {"single": _data_parallel(_alone), "ddp": _data_parallel(_ddp), "fsdp": _data_parallel(_fsdp),
              "sdp": _data_parallel(_sdp_step), "pipeline": _pipeline}
