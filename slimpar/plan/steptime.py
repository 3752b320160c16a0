"""A candidate's step time from its FLOPs at the cluster's rate and its bytes over its links.

With c = FLOPs / (peak x MFU) per worker and each communication phase's time from slimpar/plan/traffic.py:

- DDP and SDP: ``fwd + max(bwd, sync - last bucket) + last bucket`` — gradients are all-reduced in buckets
  while the backward runs (DDP's reducer, SDP's holder buckets), and the last bucket (25 MiB, DDP's default;
  all of a smaller model's gradients) is sent after the backward;
- FSDP2 (and SDP's 2-D layout): ``max(fwd, gather) + max(bwd, gather again + reduce-scatter [+ holder
  sync])`` — the all-gathers are prefetched under the compute;
- then, for every mode, what runs after the backward: the backward regime's refresh broadcasts;
- pipelines: M microbatches through P stages and P - 1 links are a flow line, ``sum(stage + link times) +
  (M - 1) x the slowest of them``: GPipe runs one such line forward, then one backward; 1F1B interleaves a
  forward with a backward in the steady state, so there a stage's time is its forward + backward and a link's
  the slower of its two directions (links are full duplex), and only the fill and drain see both; the hybrid's
  holder sync runs
  during the backward flow; then the stage replicas' gradient all-reduce (pipeline x DDP averages after the
  schedule) and a tied embedding's gradient exchange.

Every phase adds its messages in turn times the cluster's per-message latency (traffic.py), and a pipeline link
one latency per microbatch. Not modelled: kernel-launch overheads, the codecs' own compute, the optimizer step.
"""

from __future__ import annotations

from slimpar.plan.cluster import Cluster
from slimpar.plan.traffic import Load
from slimpar.plan.workload import BUCKET_BYTES, Workload


def step_seconds(w: Workload, cluster: Cluster, fsdp_layout: bool, schedule: str = "1f1b") -> dict:
    """{"compute": s, "comm": s, "step": s}: compute alone, exposed communication and the modelled step."""
    rate = cluster.flops_per_s
    t = w.traffic
    if w.stage_fwd:  # a pipeline's stages
        return _pipeline(w, rate, t, schedule)
    fwd, bwd = w.fwd / rate, w.bwd / rate
    sync = t.overlap.seconds()
    if fsdp_layout:
        step = max(fwd, t.gather.seconds()) + max(bwd, sync)
    else:
        last = _last_bucket(t.overlap, sync)
        step = fwd + max(bwd, sync - last) + last
    step += t.exposed.seconds()
    return {"compute": fwd + bwd, "comm": step - fwd - bwd, "step": step}


def _last_bucket(load: Load, seconds: float) -> float:
    busiest = max(load.sent.values(), default=1.0)
    return seconds * min(1.0, BUCKET_BYTES / busiest)


def _flow(stages: list[float], links: list[float], m: int) -> float:
    """Time for m items through alternating stages and links (a flow line: fill, then the bottleneck)."""
    return sum(stages) + sum(links) + (m - 1) * max([*stages, *links])


def _pipeline(w: Workload, rate: float, t, schedule: str) -> dict[str, float]:
    m = w.microbatches
    fwd = [f / rate for f in w.stage_fwd]
    bwd = [b / rate for b in w.stage_bwd]
    latency = t.overlap.cluster.latency_us * 1e-6  # one message per microbatch and boundary each way
    link_f = [b.fwd / m * 8 / (b.gbps * 1e9) + latency for b in t.boundaries]
    link_b = [b.bwd / m * 8 / (b.gbps * 1e9) + latency for b in t.boundaries]
    free = [0.0] * len(link_f)
    if schedule == "gpipe":
        compute = _flow(fwd, free, m) + _flow(bwd, free, m)
        flow = _flow(fwd, link_f, m) + _flow(bwd, link_b, m)
    else:
        both = [f + b for f, b in zip(fwd, bwd, strict=True)]
        duplex = [max(f, b) for f, b in zip(link_f, link_b, strict=True)]
        compute = _flow(both, free, m)
        flow = _flow(both, duplex, m) + sum(link_f) + sum(link_b) - sum(duplex)
    bwd_share = sum(bwd) / max(sum(fwd) + sum(bwd), 1e-30) * flow
    step = flow + max(0.0, t.overlap.seconds() - bwd_share) + t.exposed.seconds()
    return {"compute": compute, "comm": step - compute, "step": step}
