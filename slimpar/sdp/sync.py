"""Holder-group gradient averaging for SDP, bucketed by holder set and overlapped with backward.

Algorithm (METHODS.md Part 1): component c's gradient is averaged over its holders S_c only,
ĝ_c = (1/k_c) Σ_{i∈S_c} g_{i,c}; shared parameters over all workers; a component held by one
worker is never communicated.

Communication phases of one step:
1. Set-up (once, collective): one process group per distinct holder set with k > 1, created by
   every rank in the plan's deterministic order (``dist.new_group`` must be called by all ranks in
   the same order) — :class:`HolderGroups`.
2. During backward: a post-accumulate-grad hook marks each parameter ready; when every piece of a
   bucket is ready, the bucket is copied into one flat buffer and an async SUM all-reduce is
   launched on its group. Buckets of one group are launched strictly in their canonical order, so
   all members issue the same sequence of collectives whatever their backward order.
3. ``finish()`` (before the optimizer step): launch what is left (a piece that got no gradient
   contributes zeros), wait, divide by k, and hand the averaged values back as gradients. Whole
   parameters take a view of the bucket as their gradient (the autograd copy is freed at launch).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of an FSDP2 DTensor, else the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


@dataclass
class Piece:
    """A parameter, or a slice of one along ``dim``, that belongs to one sync bucket."""

    param: nn.Parameter
    name: str
    dim: int | None = None  # None: the whole parameter
    start: int = 0
    stop: int = 0

    @property
    def numel(self) -> int:
        t = local(self.param)
        if self.dim is None:
            return t.numel()
        return t.numel() // t.shape[self.dim] * (self.stop - self.start)

    def view(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.dim is None else t.narrow(self.dim, self.start, self.stop - self.start)


@dataclass
class Bucket:
    pieces: list[Piece]
    group: dist.ProcessGroup
    size: int  # k: number of workers averaging this bucket
    key: tuple[int, ...]
    buf: torch.Tensor | None = None
    work: object | None = None
    pending: int = 0
    params: set[int] = field(default_factory=set)

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.pieces)


class HolderGroups:
    """Process groups for every distinct holder set (plus the all-workers group), created collectively.

    ``members(S)`` maps a set of SDP workers to global ranks; with an FSDP dimension of size F each
    worker is F ranks and one group is created per shard index. ``timeout`` bounds every collective on
    the new groups (None: torch's default), so a hung holder fails the run instead of hanging it.
    """

    def __init__(self, holder_sets: list[tuple[int, ...]], n_workers: int, fsdp: int = 1,
                 world_group: dist.ProcessGroup | None = None, timeout: timedelta | None = None):
        self.fsdp = fsdp
        self.groups: dict[tuple[tuple[int, ...], int], dist.ProcessGroup] = {}
        everyone = tuple(range(n_workers))
        for hs in sorted({tuple(s) for s in holder_sets if len(s) > 1} | ({everyone} if n_workers > 1 else set())):
            for f in range(fsdp):
                ranks = [w * fsdp + f for w in hs]
                if len(ranks) == dist.get_world_size() and world_group is not None:
                    self.groups[(hs, f)] = world_group
                else:
                    self.groups[(hs, f)] = dist.new_group(ranks, timeout=timeout)

    def get(self, holder_set: tuple[int, ...], shard: int = 0) -> dist.ProcessGroup:
        return self.groups[(tuple(holder_set), shard)]


class GradSync:
    """Bucketed, overlapped holder-group all-reduce of gradients (see the module docstring)."""

    def __init__(self, buckets: list[Bucket], overlap: bool = True):
        self.buckets = buckets
        self.overlap = overlap
        self.enabled = True
        self.wait_seconds = 0.0
        self._by_param: dict[int, list[Bucket]] = {}
        self._next: dict[tuple[int, ...], int] = {}
        self._order: dict[tuple[int, ...], list[Bucket]] = {}
        self._handles = []
        for b in buckets:
            b.params = {id(p.param) for p in b.pieces}
            self._order.setdefault(b.key, []).append(b)
            for pid in b.params:
                self._by_param.setdefault(pid, []).append(b)
        seen: set[int] = set()
        for b in buckets:
            for p in b.pieces:
                if id(p.param) not in seen:
                    seen.add(id(p.param))
                    self._handles.append(p.param.register_post_accumulate_grad_hook(self._on_grad))
        self._reset()

    def _reset(self) -> None:
        for b in self.buckets:
            b.pending, b.buf, b.work = len(b.params), None, None
        self._next = {k: 0 for k in self._order}

    def _on_grad(self, param: torch.Tensor) -> None:
        g = param.grad
        if g is not None and not hasattr(g, "to_local") and g.untyped_storage().nbytes() > g.numel() * g.element_size():
            # a slice of a larger gradient (e.g. the held part of a concatenated weight): keep a compact
            # copy so the full-size gradient storage is freed with the autograd graph
            param.grad = g.clone(memory_format=torch.contiguous_format)
        if not (self.enabled and self.overlap):
            return
        for b in self._by_param.get(id(param), []):
            b.pending -= 1
            self._launch_ready(b.key)

    def _launch_ready(self, key: tuple[int, ...]) -> None:
        order = self._order[key]
        while self._next[key] < len(order) and order[self._next[key]].pending == 0:
            self._launch(order[self._next[key]])
            self._next[key] += 1

    def _launch(self, b: Bucket) -> None:
        dtype = b.pieces[0].param.dtype
        b.buf = torch.empty(b.numel, dtype=dtype, device=b.pieces[0].param.device)
        offset = 0
        for p in b.pieces:
            dst = b.buf[offset:offset + p.numel]
            g = p.param.grad
            if g is None:
                dst.zero_()
            else:
                g = local(g)
                dst.view(p.view(g).shape).copy_(p.view(g))
            if p.dim is None and not hasattr(p.param, "to_local"):
                p.param.grad = dst.view_as(p.param)  # the bucket becomes the gradient; autograd's copy is freed
            offset += p.numel
        b.work = dist.all_reduce(b.buf, op=dist.ReduceOp.SUM, group=b.group, async_op=True)

    def finish(self) -> None:
        """Launch what is left, wait for every bucket, average and write back gradients."""
        for key, order in self._order.items():
            while self._next[key] < len(order):
                self._launch(order[self._next[key]])
                self._next[key] += 1
        t0 = time.perf_counter()
        for b in self.buckets:
            b.work.wait()
        self.wait_seconds = time.perf_counter() - t0
        for b in self.buckets:
            b.buf.div_(b.size)
            offset = 0
            for p in b.pieces:
                src = b.buf[offset:offset + p.numel]
                if p.dim is not None or hasattr(p.param, "to_local"):
                    if p.param.grad is None:
                        p.param.grad = torch.zeros_like(p.param)
                    g = local(p.param.grad)
                    p.view(g).copy_(src.view(p.view(g).shape))
                offset += p.numel
        self._reset()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def make_buckets(pieces_by_set: dict[tuple[int, ...], list[Piece]], groups: HolderGroups, shard: int,
                 cap_bytes: int) -> list[Bucket]:
    """Split each holder set's pieces (already in canonical order) into buckets of about ``cap_bytes``."""
    buckets: list[Bucket] = []
    for key in sorted(pieces_by_set):
        if len(key) < 2:
            continue  # held by one worker: never communicated
        current: list[Piece] = []
        nbytes = 0
        for piece in pieces_by_set[key]:
            current.append(piece)
            nbytes += piece.numel * piece.param.element_size()
            if nbytes >= cap_bytes:
                buckets.append(Bucket(current, groups.get(key, shard), len(key), key))
                current, nbytes = [], 0
        if current:
            buckets.append(Bucket(current, groups.get(key, shard), len(key), key))
    return buckets
