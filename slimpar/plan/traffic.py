"""Bytes per training step on each link class, for a candidate on a cluster (``slimpar plan --fit``).

Every collective is modelled as a ring over its group's ranks in rank order (NCCL's and gloo's ring
algorithms; ranks fill nodes in order): each edge of the ring carries

- all-reduce: 2 (k - 1) / k x n (reduce-scatter, then all-gather);
- all-gather, reduce-scatter: (k - 1) / k x n (n the whole, unsharded tensor; gloo's reduce-scatter is an
  all-reduce);
- broadcast (SDP's backward-regime refresh): n on each edge of a chain from the root;
- point-to-point (a pipeline boundary): its bytes, on its one edge.

An edge between two workers of one node is intra-node; an edge between nodes leaves through the node's
link, which all its workers share. So a phase of communication takes
``max(busiest worker's intra bytes / intra_gbps, busiest node's inter bytes / inter_gbps)``.

What each mode sends per step (gradients in fp32, as slimpar's trainer keeps them):
DDP all-reduces every gradient; FSDP2 all-gathers the parameters in forward and the blocks' again in
backward (the root module, embedding, final norm and head, stays gathered), in the compute dtype, and
reduce-scatters the gradients; SDP all-reduces each component's gradient among its
holders (slimpar.sdp.plan), the shared parameters among everyone, and in the backward regime broadcasts the
components a worker does not hold every ``refresh_every`` steps; with ``sdp.fsdp F`` each replica is F
consecutive ranks that FSDP2-shard its subnetwork, and holders sync shard by shard. A pipeline's boundaries
send the codec's exact steady-state bytes (slimpar.pipeline.budget), its stage replicas all-reduce the stage's
gradients (the hybrid: among holders only, keep x the stage's bytes over round(keep x R) replicas; an
approximation of the stage plan), and a tied embedding's gradient crosses between the first and last stage
(the head's whole, the embedding's rows of the step's distinct ids, counted at their most: min(tokens, V)).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from slimpar.plan.cluster import Cluster


@dataclass
class Load:
    """Bytes of one phase: sent by each rank inside its node, and out of each node."""

    cluster: Cluster
    intra: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # rank -> bytes
    inter: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # node -> bytes
    sent: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # rank -> all bytes it sends

    def edge(self, src: int, dst: int, n: float) -> None:
        node = self.cluster.node_of
        self.sent[src] += n
        if node(src) == node(dst):
            self.intra[src] += n
        else:
            self.inter[node(src)] += n

    def ring(self, ranks: list[int], per_edge: float) -> None:
        if len(ranks) > 1:
            for i, r in enumerate(ranks):
                self.edge(r, ranks[(i + 1) % len(ranks)], per_edge)

    def all_reduce(self, ranks: list[int], n: float) -> None:
        k = len(ranks)
        self.ring(ranks, 2 * (k - 1) / k * n if k > 1 else 0.0)

    def gather(self, ranks: list[int], n: float) -> None:
        """An all-gather of a tensor of ``n`` bytes in all."""
        k = len(ranks)
        self.ring(ranks, (k - 1) / k * n if k > 1 else 0.0)

    def reduce_scatter(self, ranks: list[int], n: float) -> None:
        """A reduce-scatter of ``n`` bytes: NCCL's ring; gloo has none and torch runs an all-reduce for it
        (measured on the veth counters of two CPU "nodes": slimpar bench fit)."""
        if self.cluster.gloo:
            self.all_reduce(ranks, n)
        else:
            self.gather(ranks, n)

    def chain(self, ranks: list[int], n: float) -> None:
        for a, b in zip(ranks, ranks[1:], strict=False):
            self.edge(a, b, n)

    def add(self, other: Load) -> None:
        for mine, theirs in ((self.intra, other.intra), (self.inter, other.inter), (self.sent, other.sent)):
            for k, v in theirs.items():
                mine[k] += v

    @property
    def intra_max(self) -> float:
        return max(self.intra.values(), default=0.0)

    @property
    def inter_max(self) -> float:
        return max(self.inter.values(), default=0.0)

    def seconds(self) -> float:
        c = self.cluster
        inter = self.inter_max * 8 / (c.inter_gbps * 1e9) if self.inter_max else 0.0
        return max(self.intra_max * 8 / (c.intra_gbps * 1e9), inter)


@dataclass
class Boundary:
    """One pipeline boundary of one replica: bytes per step each way, and its link's speed."""

    src: int
    fwd: float
    bwd: float
    gbps: float


@dataclass
class Traffic:
    """A candidate's communication per step: the phases the step-time model overlaps differently."""

    overlap: Load  # during backward (DDP's and SDP's buckets, FSDP2's reduce-scatter)
    gather: Load  # FSDP2: the forward's all-gather of the parameters (the backward's is in ``overlap``)
    exposed: Load  # after the backward: pipeline replica sync, tied gradients, SDP refresh
    boundaries: list[Boundary] = field(default_factory=list)  # replica 0's, in stage order
    total: Load | None = None  # everything in one step (the table's bytes)


def new_traffic(cluster: Cluster) -> Traffic:
    return Traffic(Load(cluster), Load(cluster), Load(cluster))


def finish(t: Traffic, boundary_load: Load) -> Traffic:
    """Sum the phases and the boundaries into ``t.total``."""
    total = Load(t.overlap.cluster)
    for part in (t.overlap, t.gather, t.exposed, boundary_load):
        total.add(part)
    t.total = total
    return t
