"""Where a step makes the host wait for the device (host syncs), and how many aten ops it launches.

On a GPU the host queues kernels and runs ahead; it stops and waits wherever it needs a value the device has not
produced yet: ``tensor.item()`` / ``float(t)`` / ``bool(t)`` (aten ``_local_scalar_dense``), ops whose output size
depends on the data (``nonzero``, boolean indexing, ``masked_select``, ``unique``, ``bincount``,
``repeat_interleave`` without ``output_size``), ``torch.equal``, a copy to the host, a copy from the host that is not
``non_blocking`` (torch synchronises the stream after it: ``torch.tensor(data, device=...)`` and ``t.to(device)`` of
a host tensor are such copies), ``tolist()`` and ``numpy()``.
Each such point drains the queue, so every one per step costs a bubble. The same points are there on a CPU run,
where they cost nothing: :class:`SyncCounter` counts them on the CPU, so a test can hold a step to a budget
without a GPU (the device-side sync of a step's timing, ``torch.cuda.synchronize``, is not an aten op).

Every aten op is one kernel launch or more on a GPU; ``ops`` counts them too.

A copy between the host and a device shows only where the device is not the CPU (the tests' stand-in
accelerator, tests/standin_device.py); on a CPU run both ends are the host. Likewise on a CPU run the host's own
tensors and the device's are the same kind, so code that works on data which lives on the host in a GPU run too
(a batch's token ids before they are copied) says so with :func:`host_only`, and what it does there is not
counted.
"""

from __future__ import annotations

import contextlib
import contextvars
import traceback
from collections import Counter
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

# aten ops (overload packet names) that wait for the device's result before they return
_WAITS = {"_local_scalar_dense", "nonzero", "masked_select", "unique_dim", "_unique2", "_unique", "unique_consecutive",
          "bincount", "equal", "histc"}
_MASKS = (torch.bool, torch.uint8)
_HOST_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("slimpar_host_only", default=False)


@contextlib.contextmanager
def host_only() -> Iterator[None]:
    """Declare that the ops inside work on host tensors in every run (no device to wait for): not counted."""
    token = _HOST_ONLY.set(True)
    try:
        yield
    finally:
        _HOST_ONLY.reset(token)


def waits_for_device(func, args, kwargs) -> str | None:
    """The name under which ``func(*args, **kwargs)`` counts as a host sync, or None."""
    name = func.overloadpacket.__name__
    if name in _WAITS:
        return name
    if name == "repeat_interleave" and isinstance(args[0] if args else None, torch.Tensor) \
            and kwargs.get("output_size") is None and (len(args) < 3 or args[2] is None):
        return name
    if name in ("index", "index_put", "index_put_") and len(args) > 1:
        masks = [t for t in tree_leaves(args[1]) if isinstance(t, torch.Tensor) and t.dtype in _MASKS]
        return f"{name} (boolean mask)" if masks else None
    if name in ("_to_copy", "copy_"):
        return _copy_wait(name, args, kwargs)
    return None


def _copy_wait(name: str, args, kwargs) -> str | None:
    """A copy between the host and a device waits for the device's queue: to the host always; from the host unless
    ``non_blocking`` (torch then copies and synchronises the stream, the same wait)."""
    src = args[1] if name == "copy_" else args[0]
    dst = args[0].device if name == "copy_" else kwargs.get("device")
    if not isinstance(src, torch.Tensor) or dst is None:
        return None
    to_host, from_host = torch.device(dst).type == "cpu", src.device.type == "cpu"
    if to_host and not from_host:
        return "copy to host"
    blocking = not (args[2] if name == "copy_" and len(args) > 2 else kwargs.get("non_blocking", False))
    if from_host and not to_host and blocking:
        return "copy from host"
    return None


def call_site() -> str:
    """``path:line`` of the innermost frame of slimpar's own code (outside this module and the instrument) that led
    here, else the innermost frame outside torch: where a sync comes from."""
    frames = traceback.extract_stack()[:-2]
    ours = [f for f in frames if "/slimpar/" in f.filename and not f.filename.endswith(("syncs.py", "comm.py"))]
    other = [f for f in frames if "/torch/" not in f.filename]
    f = (ours or other or frames)[-1]
    return f"{f.filename.split('/slimpar/')[-1] if '/slimpar/' in f.filename else f.filename}:{f.lineno}"


class SyncCount:
    """Host syncs by kind and call site, and aten ops seen (fed by :meth:`see`; ``tolist`` / ``numpy`` through
    :meth:`methods`)."""

    def __init__(self) -> None:
        self.syncs: Counter[str] = Counter()
        self.ops = 0

    @property
    def total(self) -> int:
        return sum(self.syncs.values())

    def see(self, func, args, kwargs) -> None:
        if _HOST_ONLY.get():
            return
        self.ops += 1
        kind = waits_for_device(func, args, kwargs or {})
        if kind:
            self.syncs[f"{kind} at {call_site()}"] += 1

    @contextlib.contextmanager
    def methods(self) -> Iterator[None]:
        """Count ``Tensor.tolist`` and ``Tensor.numpy``, which read a tensor's memory without an aten op."""
        saved = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}

        def counted(name):
            def method(t, *a, **k):
                if not _HOST_ONLY.get():
                    self.syncs[f"{name} at {call_site()}"] += 1
                return saved[name](t, *a, **k)
            return method

        try:
            for name in saved:
                setattr(torch.Tensor, name, counted(name))
            yield
        finally:
            for name, fn in saved.items():
                setattr(torch.Tensor, name, fn)


class CountingMode(TorchDispatchMode):
    """A dispatch mode with a :class:`SyncCount` whose tensor-method patches live exactly as long as the mode."""

    def __init__(self) -> None:
        super().__init__()
        self.count = SyncCount()
        self._methods = None

    def __enter__(self):
        self._methods = self.count.methods()
        self._methods.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._methods.__exit__(*exc)


class SyncCounter(CountingMode):
    """``with SyncCounter() as c: ...``, then ``c.count.total`` host syncs and ``c.count.ops`` aten ops."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(is_traceable_wrapper_subclass(t) for t in tree_leaves((args, kwargs))):
            return NotImplemented  # DTensor: count the plain ops it runs, which come back here
        self.count.see(func, args, kwargs)
        return func(*args, **(kwargs or {}))
