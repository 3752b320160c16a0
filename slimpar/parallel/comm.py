"""Exact accounting of what one step allocates and communicates, per rank.

``StepInstrument`` is one ``TorchDispatchMode`` that sees every aten and c10d op of the step:

* storage tracker: records each storage an op allocates (outputs that alias an input are views or
  in-place results and are skipped) and learns of its release through ``weakref.finalize``; the
  peak of live bytes is exact and deterministic (torch has no CPU allocator statistics);
* collective counter: logical bytes of every tensor entering a ``c10d`` collective or
  point-to-point op, by op and process group — it sees raw ``torch.distributed`` calls, DDP's C++
  reducer and FSDP2 alike, because all of them go through the dispatcher;
* traffic model: the bytes this rank sends and receives in each of those ops under gloo's algorithms
  (:func:`traffic`, documented in docs/outputs.md), rounded to whole bytes once per step;
* host syncs and aten ops (:mod:`slimpar.parallel.syncs`): every point where a GPU run would wait for the
  device, and every op it would launch.

Wrapper subclasses (DTensor) get ``NotImplemented`` so that their inner plain-tensor ops come back
to the mode. The mode is only used on instrumented steps; its Python overhead would distort timing.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from fractions import Fraction

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from slimpar.parallel.syncs import CountingMode

# op name -> index of the argument whose bytes this rank contributes
_COLLECTIVE_INPUT = {
    "allreduce_": 0,
    "allreduce_coalesced_": 0,
    "broadcast_": 0,
    "reduce_": 0,
    "allgather_": 1,
    "_allgather_base_": 1,
    "allgather_into_tensor_coalesced_": 1,
    "reduce_scatter_": 1,
    "_reduce_scatter_base_": 1,
    "reduce_scatter_tensor_coalesced_": 1,
    "alltoall_base_": 1,
    "alltoall_": 1,
    "send": 0,
    "gather_": 1,
    "scatter_": 1,
}


_RING_REDUCE = {"allreduce_", "allreduce_coalesced_"}
_RING_GATHER = {"allgather_", "_allgather_base_", "allgather_into_tensor_coalesced_"}
_SCATTER_LIKE = {"reduce_scatter_", "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_", "alltoall_base_",
                 "alltoall_"}
_RECV = {"recv_": 0, "recv_any_source_": 0}  # received only: not part of the bytes fed into collectives
_ROOT_ARG = {"broadcast_": 2, "reduce_": 3, "gather_": 3, "scatter_": 3}


def binomial_broadcast(k: int, root: int) -> list[tuple[int, int]]:
    """(messages sent, messages received) per group rank in gloo's broadcast (``gloo::broadcast``): a
    binomial tree over virtual ranks ``(rank - root) mod k``; the root sends ceil(log2 k) full copies,
    inner nodes forward, leaves only receive. Each message is the whole tensor."""
    dim = (k - 1).bit_length()
    out = []
    for rank in range(k):
        vrank, sends, recvs, mask = (rank - root) % k, 0, 0, (1 << dim) - 1
        for i in range(dim):
            mask ^= 1 << i
            if vrank & mask or (vrank ^ (1 << i)) >= k:
                continue
            if vrank & (1 << i):
                recvs += 1
            else:
                sends += 1
        out.append((sends, recvs))
    return out


def ring_allreduce(n: int, k: int) -> Fraction:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``n`` bytes over ``k`` ranks:
    reduce-scatter then all-gather, each passing k - 1 of k chunks on (gloo's ``ring``; its padding of
    uneven chunks is ignored)."""
    return Fraction(2 * n * (k - 1), k) if k > 1 else Fraction(0)


def traffic(name: str, n: int, k: int, rank: int, root: int | None = None) -> tuple[Fraction, Fraction]:
    """(sent, received) bytes of this rank (group rank ``rank`` of ``k``) in the c10d op ``name`` whose
    counted argument (:data:`_COLLECTIVE_INPUT`, or the received tensor for ``recv_``) holds ``n`` bytes."""
    n = Fraction(n)
    if k <= 1:
        return Fraction(0), Fraction(0)
    if name in _RING_REDUCE:
        return ring_allreduce(int(n), k), ring_allreduce(int(n), k)
    if name in _RING_GATHER:  # ring all-gather of each rank's n bytes
        return n * (k - 1), n * (k - 1)
    if name in _SCATTER_LIKE:  # n = the whole input; everything but this rank's own 1/k leaves and arrives
        return n * (k - 1) / k, n * (k - 1) / k
    if name == "broadcast_":
        sends, recvs = binomial_broadcast(k, root)[rank]
        return n * sends, n * recvs
    if name in ("reduce_", "gather_"):  # modelled linearly: every non-root sends n, the root receives the rest
        return (Fraction(0), n * (k - 1)) if rank == root else (n, Fraction(0))
    if name == "scatter_":  # the root holds the k pieces (n bytes) and keeps its own
        return (n * (k - 1) / k, Fraction(0)) if rank == root else (Fraction(0), n)
    if name == "send":
        return n, Fraction(0)
    if name in _RECV:
        return Fraction(0), n
    return Fraction(0), Fraction(0)


def _nbytes(x) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(x) if isinstance(t, torch.Tensor))


def _group(args):
    """The ProcessGroup among a c10d op's arguments (ops receive it boxed as a ScriptObject)."""
    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                return dist.ProcessGroup.unbox(a)
            except (RuntimeError, TypeError):
                return None
    return None


def storage_key(st: torch.UntypedStorage) -> int:
    """A live storage's identity: its data_ptr, or for a fake tensor's storage (FakeTensorMode, where every
    data_ptr is 0) the address of its StorageImpl, which is as unique among live storages."""
    if st.device.type == "meta":
        return st._cdata
    return st.data_ptr()


def _storage_key(t: torch.Tensor) -> int | None:
    """:func:`storage_key` of a tensor's storage, or None for storages Python cannot address (e.g. ones
    FSDP2 resized to zero bytes between all-gathers)."""
    try:
        return storage_key(t.untyped_storage())
    except RuntimeError:
        return None


class StepInstrument(CountingMode):
    """Peak of newly allocated live storage and bytes entering collectives during a ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.allocated: set[int] = set()
        self.comm: dict[str, int] = defaultdict(int)  # "op@group" -> bytes
        self.calls: dict[str, int] = defaultdict(int)
        self.sent: dict[str, Fraction] = defaultdict(Fraction)  # "op@group" -> modelled bytes sent
        self.recv: dict[str, Fraction] = defaultdict(Fraction)  # "op@group" -> modelled bytes received

    def _free(self, key: int, n: int) -> None:
        self.live -= n
        self.allocated.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        if any(is_traceable_wrapper_subclass(t) for t in leaves if isinstance(t, torch.Tensor)):
            return NotImplemented
        self.count.see(func, args, kwargs)
        if func.namespace == "c10d":
            name = func._schema.name.split("::")[-1]
            idx = _COLLECTIVE_INPUT.get(name)
            pg = _group(args)
            # a broadcast's bytes enter the collective at its root only; receivers only receive
            is_receiver = name == "broadcast_" and pg is not None and pg.rank() != args[2]
            key = f"{name}@{pg.group_name}x{pg.size()}" if pg is not None else name
            if idx is not None and idx < len(args) and not is_receiver:
                self.comm[key] += _nbytes(args[idx])
                self.calls[key] += 1
            self._count_traffic(name, key, args, pg)
        out = func(*args, **kwargs)
        inputs = {k for k in (_storage_key(t) for t in leaves if isinstance(t, torch.Tensor)) if k is not None}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            key = _storage_key(t)
            if key is None:
                continue
            st = t.untyped_storage()
            n = st.nbytes()
            if n and key not in inputs and key not in self.allocated:
                self.allocated.add(key)
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(st, self._free, key, n)
        return out

    def _count_traffic(self, name: str, key: str, args, pg) -> None:
        # a broadcast's receivers and a scatter's non-roots hold the received tensor in argument 0
        root_arg = _ROOT_ARG.get(name)
        root = args[root_arg] if root_arg is not None and root_arg < len(args) else None
        idx = _RECV.get(name, _COLLECTIVE_INPUT.get(name))
        if name in ("broadcast_", "scatter_") and pg is not None and pg.rank() != root:
            idx = 0
        if idx is None or idx >= len(args) or pg is None:
            return
        sent, recv = traffic(name, _nbytes(args[idx]), pg.size(), pg.rank(), root)
        self.sent[key] += sent
        self.recv[key] += recv

    @property
    def comm_bytes(self) -> int:
        """Bytes fed into collectives and sends (a broadcast's at its root only)."""
        return sum(self.comm.values())

    def traffic(self) -> dict:
        """This rank's modelled bytes sent and received at the step, in total and by op (whole bytes)."""
        return {"comm_bytes_sent": round(sum(self.sent.values())), "comm_bytes_recv": round(sum(self.recv.values())),
                "comm_sent_by_op": {k: round(v) for k, v in self.sent.items() if v},
                "comm_recv_by_op": {k: round(v) for k, v in self.recv.items() if v}}


def wire_bytes_written() -> int | None:
    """Bytes this process has written (``/proc/self/io`` wchar): gloo's sends show up here exactly."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None
