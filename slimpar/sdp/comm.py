"""The collectives SDP's holder sync uses, over real process groups or simulated in one process.

SDP's synchronisation (:mod:`slimpar.sdp.holders`) is written once, against a small set of collectives
keyed by *holder set* (a sorted tuple of SDP worker indices). Each call passes one tensor per SDP worker
that lives in this process:

- :class:`GroupComm`: one worker per process; the holder sets' process groups are sub-groups of any
  parent group (the world, a pipeline stage's replica group, ...), created by
  :class:`slimpar.parallel.groups.GroupFactory` on every rank in the same order. With an FSDP dimension
  of size F, worker w is the parent's group-ranks w·F .. w·F + F − 1 and every holder set has one group
  per shard index.
- :class:`LocalComm`: every worker in this process (``VirtualSDP``); a sum adds the workers' tensors in
  the order gloo's ring all-reduce adds them (:func:`ring_sum`), so on CPU a virtual run is bit-identical
  to the multi-process gloo run.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from slimpar.parallel.device import recv, send
from slimpar.parallel.groups import GroupFactory

Key = tuple[int, ...]


class Done:
    """A finished collective (the local one is synchronous)."""

    def wait(self) -> None:
        return None


class GroupComm:
    """Holder-set collectives on process groups; this process is SDP worker ``worker`` (shard ``shard``).
    ``factory``: a :class:`GroupFactory` over ``parent`` whose groups to reuse (e.g. holder-sharded FSDP2's),
    so that no set gets a second group; by default a new one with ``timeout``."""

    def __init__(self, holder_sets: list[Key], n_workers: int, parent: dist.ProcessGroup | None = None,
                 fsdp: int = 1, timeout: timedelta | None = None, factory: GroupFactory | None = None):
        self.parent = dist.group.WORLD if parent is None else parent
        self.factory = factory if factory is not None else GroupFactory(parent, timeout)
        if self.factory.parent is not self.parent:
            raise ValueError("GroupComm's factory must create sub-groups of its parent group")
        self.fsdp = fsdp
        self.worker, self.shard = divmod(dist.get_rank(self.parent), fsdp)
        self.workers = [self.worker]
        everyone = tuple(range(n_workers))
        sets = sorted({tuple(s) for s in holder_sets if len(s) > 1} | ({everyone} if n_workers > 1 else set()))
        local = [tuple(w * fsdp + f for w in hs) for hs in sets for f in range(fsdp)]
        made = self.factory.create(local)
        self.groups = {(hs, f): made[tuple(w * fsdp + f for w in hs)] for hs in sets for f in range(fsdp)
                       if tuple(w * fsdp + f for w in hs) in made}

    def group(self, key: Key) -> dist.ProcessGroup:
        return self.groups[(tuple(key), self.shard)]

    def all_reduce(self, key: Key, bufs: dict[int, torch.Tensor], async_op: bool = False):
        """SUM over the holders of ``key`` (this shard), in place."""
        work = dist.all_reduce(bufs[self.worker], op=dist.ReduceOp.SUM, group=self.group(key), async_op=async_op)
        return work if async_op else Done()

    def broadcast(self, key: Key, bufs: dict[int, torch.Tensor], root: int) -> None:
        """Worker ``root``'s tensor to every member of ``key`` (this shard)."""
        src = self.factory.global_rank(root * self.fsdp + self.shard)
        dist.broadcast(bufs[self.worker], src=src, group=self.group(key))

    def all_gather(self, key: Key, bufs: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        """Every member's tensor, in worker order."""
        out = [torch.empty_like(bufs[self.worker]) for _ in key]
        dist.all_gather(out, bufs[self.worker], group=self.group(key))
        return out

    def sum_all(self, t: dict[int, torch.Tensor]) -> torch.Tensor:
        """SUM over the whole parent group (every worker and shard): the clip norm's partial sums."""
        dist.all_reduce(t[self.worker], group=self.parent)
        return t[self.worker]

    def broadcast_from(self, t: torch.Tensor, root: int) -> None:
        """Worker ``root``'s (first shard's) tensor to every rank of the parent group (the full-model gather)."""
        dist.broadcast(t, src=self.factory.global_rank(root * self.fsdp), group=self.parent)

    def send_to(self, t: torch.Tensor, src: int, dst: int) -> None:
        """Worker ``src``'s (first shard's) tensor to worker ``dst``'s first shard, point to point (the gather to
        one rank); other ranks and shards do nothing. Every pair's sends and receives come in the same order."""
        if src == dst or self.shard:
            return
        if self.worker == src:
            send(t, self.parent, dst * self.fsdp)  # through the host over gloo (parallel/device.py)
        elif self.worker == dst:
            recv(t, self.parent, src * self.fsdp)


class LocalComm:
    """Every SDP worker in this process: the same collectives as plain arithmetic (see the module docstring)."""

    def __init__(self, n_workers: int):
        self.workers = list(range(n_workers))
        self.fsdp, self.shard = 1, 0
        self.groups: dict = {}  # no process groups

    def all_reduce(self, key: Key, bufs: dict[int, torch.Tensor], async_op: bool = False) -> Done:
        total = ring_sum([bufs[w] for w in key])
        for w in key:
            bufs[w].copy_(total)
        return Done()

    def broadcast(self, key: Key, bufs: dict[int, torch.Tensor], root: int) -> None:
        for w in key:
            if w != root:
                bufs[w].copy_(bufs[root])

    def all_gather(self, key: Key, bufs: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        return [bufs[w] for w in key]

    def sum_all(self, t: dict[int, torch.Tensor]) -> torch.Tensor:
        return ring_sum([t[w] for w in self.workers])

    def broadcast_from(self, t: torch.Tensor, root: int) -> None:
        """Nothing to send: the one full model was filled from worker ``root``'s tensor already."""

    def send_to(self, t: torch.Tensor, src: int, dst: int) -> None:
        """Nothing to send: every worker lives in this process."""


def ring_sum(flats: list[torch.Tensor]) -> torch.Tensor:
    """Σ of k equal-length flat tensors, added in the order gloo's ring all-reduce adds them (gloo's
    ``allreduce.cc``, checked bit for bit against gloo for k = 3 and 4 up to 3M float32 elements): the buffer
    is cut into 2k segments of ceil(L / 2k) elements; segment s belongs to chunk c = s // 2, whose partial sum
    starts at group rank c - 1 and picks up ranks c - 2, c - 3, ... (mod k) as it travels the ring."""
    k = len(flats)
    flats = [f.reshape(-1) for f in flats]
    n = flats[0].numel()
    if k == 1:
        return flats[0].clone()
    seg = -(-n // (2 * k))
    out = torch.empty_like(flats[0])
    for s in range(2 * k):
        lo, hi = s * seg, min(n, (s + 1) * seg)
        if lo >= hi:
            continue
        c = s // 2
        acc = flats[(c - 1) % k][lo:hi].clone()
        for j in range(2, k + 1):
            acc += flats[(c - j) % k][lo:hi]
        out[lo:hi] = acc
    return out
