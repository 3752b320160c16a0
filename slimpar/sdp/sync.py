"""Holder-group gradient averaging for SDP, bucketed by holder set and overlapped with backward.

Algorithm (docs/methods.md, 'Holder averaging'): component c's gradient is averaged over its holders S_c only,
ĝ_c = (1/k_c) Σ_{i∈S_c} g_{i,c}; shared parameters over all workers; a component held by one
worker is never communicated.

The collectives go through a communicator (:mod:`slimpar.sdp.comm`): process groups of any parent
group, or every worker of ``VirtualSDP`` in one process; a bucket holds the pieces of each worker that
lives in this process (one for a real run).

Communication phases of one step:
1. Set-up (once, collective): one process group per distinct holder set with k > 1, created by
   every rank in the plan's deterministic order (:class:`slimpar.sdp.comm.GroupComm`).
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
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
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
    """One all-reduce: the same run of pieces on every holder (``pieces[w]``: worker w's, for the workers in
    this process); ``key`` is the holder set and ``size`` = k."""

    pieces: dict[int, list[Piece]]
    key: tuple[int, ...]
    bufs: dict[int, torch.Tensor] = field(default_factory=dict)
    work: object | None = None
    pending: int = 0
    params: set[int] = field(default_factory=set)

    @property
    def size(self) -> int:
        return len(self.key)

    @property
    def numel(self) -> int:
        return sum(p.numel for p in next(iter(self.pieces.values())))


class GradSync:
    """Bucketed, overlapped holder-set all-reduce of gradients (see the module docstring).

    ``overlap``: launch each bucket from backward hooks as soon as its gradients are final (one worker per
    process only); otherwise everything is launched by ``finish()``. Parameters that do not require a
    gradient (e.g. a frozen projector) contribute zeros and are given none.

    ``accumulations`` = M: a gradient is final after M backward accumulations (a pipeline schedule's M
    micro-batches), and ``divide_by`` = M divides it when it enters its bucket, the mean over micro-batches
    that the schedule's own ``scale_grads`` would take later, after the all-reduce had been launched.

    ``reduce_dtype``: the dtype of the bucket buffers, so of the holder sums (None: the parameters' own;
    float64 parameters, as in reference tests, always sum in float64). fp32 by default in
    :class:`~slimpar.sdp.holders.HolderSync`: bf16 parameters would otherwise sum k gradients in bf16. Where it
    differs from a parameter's dtype the averaged values are cast back into its gradient (no view of the
    bucket), as FSDP2's ``reduce_dtype`` does.
    """

    def __init__(self, buckets: list[Bucket], comm, overlap: bool = True, accumulations: int = 1,
                 divide_by: int = 1, reduce_dtype: torch.dtype | None = None):
        self.buckets, self.comm = buckets, comm
        self.reduce_dtype = reduce_dtype
        self.overlap = overlap
        self.accumulations, self.divide_by = accumulations, divide_by
        self._seen: dict[int, int] = {}
        self.enabled = True
        self.wait_seconds = 0.0
        self._by_param: dict[int, list[Bucket]] = {}
        self._order: dict[tuple[int, ...], list[Bucket]] = {}
        self._next: dict[tuple[int, ...], int] = {}
        self._handles = []
        for b in buckets:
            b.params = {id(p.param) for pcs in b.pieces.values() for p in pcs}
            self._order.setdefault(b.key, []).append(b)
            for pid in b.params:
                self._by_param.setdefault(pid, []).append(b)
        seen: set[int] = set()
        hook = _weak_hook(weakref.ref(self))
        for b in buckets:
            for p in (q for pcs in b.pieces.values() for q in pcs):
                if id(p.param) not in seen:
                    seen.add(id(p.param))
                    self._handles.append(p.param.register_post_accumulate_grad_hook(hook))
        self._unhook = weakref.finalize(self, _remove_hooks, self._handles)  # at remove(), or when dropped
        self._reset()

    def _reset(self) -> None:
        for b in self.buckets:
            b.pending, b.bufs, b.work = len(b.params), {}, None
        self._next = {k: 0 for k in self._order}
        self._seen = {}

    def _on_grad(self, param: torch.Tensor) -> None:
        g = param.grad
        if g is not None and not hasattr(g, "to_local") and g.untyped_storage().nbytes() > g.numel() * g.element_size():
            # a slice of a larger gradient (e.g. the held part of a concatenated weight): keep a compact
            # copy so the full-size gradient storage is freed with the autograd graph
            param.grad = g.clone(memory_format=torch.contiguous_format)
        if not (self.enabled and self.overlap):
            return
        self._seen[id(param)] = self._seen.get(id(param), 0) + 1
        if self._seen[id(param)] < self.accumulations:
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
        for w, pieces in b.pieces.items():
            b.bufs[w] = _pack(pieces, b.numel, self.reduce_dtype)
            if self.divide_by != 1:
                b.bufs[w].div_(self.divide_by)
        b.work = self.comm.all_reduce(b.key, b.bufs, async_op=True)

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
            for w, pieces in b.pieces.items():
                _unpack(pieces, b.bufs[w].div_(b.size))
        self._reset()

    def remove(self) -> None:
        self._unhook()


def _weak_hook(ref: weakref.ref) -> Callable[[torch.Tensor], None]:
    """The post-accumulate-grad hook of a :class:`GradSync`'s parameters, reaching it through a weak reference.

    Why not the bound method: a tensor's hooks are held from C++ (autograd's hook on the parameter), where Python's
    cycle collector cannot see them, so a hook holding its GradSync kept the GradSync, its buckets, the parameters
    and its process groups alive after the wrapper was dropped, for the rest of the process. Those groups were then
    destroyed during interpreter finalization, where a gloo group can abort the process (SIGABRT, "terminate called
    without an active exception") after a run has finished."""

    def hook(param: torch.Tensor) -> None:
        sync = ref()
        if sync is not None:
            sync._on_grad(param)

    return hook


def _remove_hooks(handles: list) -> None:
    for h in handles:
        h.remove()


def _pack(pieces: list[Piece], numel: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """One worker's gradients of a bucket in one flat buffer of ``dtype`` (default: the parameters'); whole
    parameters of that dtype take a view of it as their gradient (autograd's copy is freed at launch)."""
    own = pieces[0].param.dtype
    buf = torch.empty(numel, dtype=own if dtype is None or own == torch.float64 else dtype,
                      device=pieces[0].param.device)
    offset = 0
    for p in pieces:
        dst = buf[offset:offset + p.numel]
        g = p.param.grad
        if g is None:
            dst.zero_()
        else:
            g = local(g)
            dst.view(p.view(g).shape).copy_(p.view(g))
        if _grad_is_view(p, buf):
            p.param.grad = dst.view_as(p.param)
        offset += p.numel
    return buf


def _unpack(pieces: list[Piece], buf: torch.Tensor) -> None:
    """Write the averaged buffer back where the gradients are not views of it (slices, DTensor shards)."""
    offset = 0
    for p in pieces:
        src = buf[offset:offset + p.numel]
        if not _grad_is_view(p, buf) and p.param.requires_grad:
            if p.param.grad is None:
                p.param.grad = torch.zeros_like(p.param)
            g = local(p.param.grad)
            p.view(g).copy_(src.view(p.view(g).shape))
        offset += p.numel


def _grad_is_view(p: Piece, buf: torch.Tensor) -> bool:
    """Whether the piece's gradient is a view of the bucket: a whole, plain parameter of the bucket's dtype."""
    return (p.dim is None and not hasattr(p.param, "to_local") and p.param.requires_grad
            and p.param.dtype == buf.dtype)


def make_buckets(pieces_by_worker: dict[int, dict[tuple[int, ...], list[Piece]]], cap_bytes: int) -> list[Bucket]:
    """Split each holder set's pieces (already in canonical order, the same on every holder) into buckets of
    about ``cap_bytes``; sets held by one worker are never communicated."""
    keys = sorted({k for by_set in pieces_by_worker.values() for k in by_set if len(k) > 1})
    buckets: list[Bucket] = []
    for key in keys:
        mine = {w: by_set[key] for w, by_set in pieces_by_worker.items() if key in by_set}
        first = next(iter(mine.values()))
        start, nbytes = 0, 0
        for j, piece in enumerate(first):
            nbytes += piece.numel * piece.param.element_size()
            if nbytes >= cap_bytes or j == len(first) - 1:
                buckets.append(Bucket({w: pcs[start:j + 1] for w, pcs in mine.items()}, key))
                start, nbytes = j + 1, 0
    return buckets
