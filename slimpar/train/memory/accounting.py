"""Per-rank memory accounting: parameters, gradients, optimizer state, activations, peaks.

Bytes are counted by unique storage, so views (FSDP2 gradients inside one reduce-scatter buffer,
DDP gradients as bucket views, tied embeddings) count once.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterable, Iterator

import torch
from torch.utils._pytree import tree_leaves

from slimpar.parallel.comm import storage_key


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # DTensor -> this rank's shard


def storages(tensors: Iterable[torch.Tensor]) -> dict[int, int]:
    """storage key (data_ptr; a fake storage's identity, :func:`~slimpar.parallel.comm.storage_key`) -> nbytes
    of the unique storages behind ``tensors``."""
    out: dict[int, int] = {}
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        st = _local(t).untyped_storage()
        if st.nbytes():
            out[storage_key(st)] = st.nbytes()
    return out


def param_storages(module: torch.nn.Module) -> dict[int, int]:
    return storages(module.parameters())


def grad_storages(module: torch.nn.Module) -> dict[int, int]:
    return storages(p.grad for p in module.parameters() if p.grad is not None)


def optimizer_storages(opt: torch.optim.Optimizer) -> dict[int, int]:
    return storages(t for state in opt.state.values() for t in tree_leaves(state) if isinstance(t, torch.Tensor)
                    and t.dim() > 0)


def buffer_storages(module: torch.nn.Module) -> dict[int, int]:
    return storages(module.buffers())


def _is_parameter(t: torch.Tensor) -> bool:
    """A parameter or a view of one (``linear`` saves the transposed weight)."""
    return isinstance(t, torch.nn.Parameter) or isinstance(getattr(t, "_base", None), torch.nn.Parameter)


class SavedActivations:
    """Bytes of tensors autograd saves for backward (``saved_tensors_hooks``): the largest sum of such
    storages alive at once. Each counts from its first save until it is freed (a backward releases it):
    with one forward and one backward that is every storage the forward saved; with microbatches in
    flight (a pipeline's 1F1B, gradient accumulation) it is the most they hold together. Keyed by storage
    and freed through a finalizer, the count does not depend on the allocator reusing an address.
    Parameters are excluded, by storage (``exclude``) and by kind: FSDP2's unsharded parameters live in
    storages it frees and reallocates per block."""

    def __init__(self, exclude: Iterable[int]):
        self.exclude = set(exclude)
        self.live: dict[int, int] = {}  # storage key -> bytes, while the storage lives
        self.total = self.peak = 0

    def _pack(self, t: torch.Tensor):
        if _is_parameter(t):  # also FSDP2's all-gathered parameters, whose storages are not in ``exclude``
            return t
        st = _local(t).untyped_storage()
        key = storage_key(st)
        if key not in self.exclude and key not in self.live and st.nbytes():
            self.live[key] = st.nbytes()
            self.total += st.nbytes()
            self.peak = max(self.peak, self.total)
            weakref.finalize(st, self._free, key)
        return t

    def _free(self, key: int) -> None:
        self.total -= self.live.pop(key)

    @contextlib.contextmanager
    def record(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield

    @property
    def bytes(self) -> int:
        return self.peak


# glibc keeps freed heap memory unless blocks above this size are mmapped; only then does a step's RSS
# increase track its tensors (mallopt(3), M_MMAP_THRESHOLD). The setting must be in the environment when the
# process starts, which slimpar's launcher does and torchrun does not.
RSS_ENV = "MALLOC_MMAP_THRESHOLD_"


def rss_trustworthy() -> bool:
    """Whether this process started with ``MALLOC_MMAP_THRESHOLD_`` at 64 KiB or less."""
    try:
        return 0 < int(os.environ.get(RSS_ENV, "")) <= 65536
    except ValueError:
        return False


def reset_peak_rss() -> int | None:
    """Reset VmHWM to the current RSS (Linux) and return that RSS in bytes; None where the peak cannot be
    read, or would not mean anything because glibc reuses freed memory (:func:`rss_trustworthy`)."""
    if not rss_trustworthy():
        return None
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status_kib("VmRSS")


def peak_rss() -> int | None:
    return _status_kib("VmHWM")


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
