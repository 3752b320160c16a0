"""A candidate's step time from its FLOPs at the cluster's rate and its bytes over its links.

With c = FLOPs / (peak x MFU) per worker and each communication phase's time from slimpar/plan/traffic.py:

- DDP and SDP: ``fwd + max(bwd, sync) + last bucket`` — gradients are all-reduced in buckets while the
  backward runs (DDP's reducer, SDP's holder buckets), and the last bucket (25 MiB, DDP's default) waits
  for the backward to end;
- FSDP2 (and SDP's 2-D layout): ``max(fwd, gather) + max(bwd, gather again + reduce-scatter [+ holder
  sync])`` — the all-gathers are prefetched under the compute;
- then, for every mode, what runs after the backward: the backward regime's refresh broadcasts;
- pipelines (GPipe and 1F1B alike): each direction of M microbatches through P stages and P - 1 links is a
  flow line, ``sum(stage + link times) + (M - 1) x the slowest of them``; the hybrid's holder sync runs
  during the backward flow; then the stage replicas' gradient all-reduce (pipeline x DDP averages after the
  schedule) and a tied embedding's gradient exchange.

Not modelled: latency per message, kernel-launch overheads, the codecs' own compute, and the optimizer step.
"""

from __future__ import annotations

from slimpar.plan.cluster import Cluster
from slimpar.plan.traffic import Load
from slimpar.plan.workload import Workload

BUCKET_BYTES = 25 * 1024**2


def step_seconds(w: Workload, cluster: Cluster, mode: str, fsdp_layout: bool) -> dict[str, float]:
    """{"compute": s, "comm": s, "step": s}: compute alone, exposed communication and the modelled step."""
    rate = cluster.flops_per_s
    t = w.traffic
    if mode == "pipeline":
        return _pipeline(w, rate, t)
    fwd, bwd = w.fwd / rate, w.bwd / rate
    sync = t.overlap.seconds()
    if fsdp_layout:
        step = max(fwd, t.gather.seconds()) + max(bwd, sync)
    else:
        step = fwd + max(bwd, sync) + _last_bucket(t.overlap, sync)
    step += t.exposed.seconds()
    return {"compute": fwd + bwd, "comm": step - fwd - bwd, "step": step}


def _last_bucket(load: Load, seconds: float) -> float:
    busiest = max(load.sent.values(), default=1.0)
    return seconds * min(1.0, BUCKET_BYTES / busiest)


def _flow(stages: list[float], links: list[float], m: int) -> float:
    """Time for m items through alternating stages and links (a flow line: fill, then the bottleneck)."""
    return sum(stages) + sum(links) + (m - 1) * max([*stages, *links])


def _pipeline(w: Workload, rate: float, t) -> dict[str, float]:
    m = w.microbatches
    fwd = [f / rate for f in w.stage_fwd]
    bwd = [b / rate for b in w.stage_bwd]
    link_f = [b.fwd / m * 8 / (b.gbps * 1e9) for b in t.boundaries]
    link_b = [b.bwd / m * 8 / (b.gbps * 1e9) for b in t.boundaries]
    compute = _flow(fwd, [0.0] * len(link_f), m) + _flow(bwd, [0.0] * len(link_b), m)
    step = _flow(fwd, link_f, m) + max(_flow(bwd, link_b, m), t.overlap.seconds()) + t.exposed.seconds()
    return {"compute": compute, "comm": step - compute, "step": step}
