"""Exact accounting of what one step allocates and communicates, per rank.

``StepInstrument`` is one ``TorchDispatchMode`` that sees every aten and c10d op of the step:

* storage tracker: records each storage an op allocates (outputs that alias an input are views or
  in-place results and are skipped) and learns of its release through ``weakref.finalize``; the
  peak of live bytes is exact and deterministic (torch has no CPU allocator statistics);
* collective counter: logical bytes of every tensor entering a ``c10d`` collective or
  point-to-point op, by op and process group — it sees raw ``torch.distributed`` calls, DDP's C++
  reducer and FSDP2 alike, because all of them go through the dispatcher.

Wrapper subclasses (DTensor) get ``NotImplemented`` so that their inner plain-tensor ops come back
to the mode. The mode is only used on instrumented steps; its Python overhead would distort timing.
"""

from __future__ import annotations

import weakref
from collections import defaultdict

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

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


def _storage_key(t: torch.Tensor) -> int | None:
    """data_ptr of the storage, or None for storages Python cannot address (e.g. ones FSDP2 resized
    to zero bytes between all-gathers)."""
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return None


class StepInstrument(TorchDispatchMode):
    """Peak of newly allocated live storage and bytes entering collectives during a ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.allocated: set[int] = set()
        self.comm: dict[str, int] = defaultdict(int)  # "op@group" -> bytes
        self.calls: dict[str, int] = defaultdict(int)

    def _free(self, key: int, n: int) -> None:
        self.live -= n
        self.allocated.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        if any(is_traceable_wrapper_subclass(t) for t in leaves if isinstance(t, torch.Tensor)):
            return NotImplemented
        if func.namespace == "c10d":
            name = func._schema.name.split("::")[-1]
            idx = _COLLECTIVE_INPUT.get(name)
            pg = _group(args)
            # a broadcast's bytes enter the collective at its root only; receivers only receive
            is_receiver = name == "broadcast_" and pg is not None and pg.rank() != args[2]
            if idx is not None and idx < len(args) and not is_receiver:
                key = f"{name}@{pg.group_name}x{pg.size()}" if pg is not None else name
                self.comm[key] += _nbytes(args[idx])
                self.calls[key] += 1
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

    @property
    def comm_bytes(self) -> int:
        return sum(self.comm.values())


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
