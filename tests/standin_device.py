"""A stand-in accelerator: slimpar's code on a device that is not the CPU, with a process group that takes that
device's tensors only, so a CPU test fails wherever a GPU run would hand NCCL a host tensor (docs/gpu.md).

Why not a fake CUDA device: this machine's torch has no CUDA, and ``Tensor.to("cuda")`` and ``copy_`` ask for
CUDA's device guard in C++ before any fake-tensor mode can answer. The ``meta`` device has a guard and every
operator, so it stands in for the GPU:

1. the process group is torch's ``fake`` backend registered for the meta device only
   (``init_process_group("meta:fake")``), so c10d refuses a CPU tensor ("No backend type associated with
   device type cpu") as a CUDA-only NCCL group does; a fake tensor's collective never reaches the backend
   (FakeTensorMode answers it), so :class:`_DeviceRule` checks every c10d op's tensors itself;
2. the code runs under ``FakeTensorMode`` (the machinery of ``slimpar plan --memory``,
   slimpar/train/memory/predict.py), whose device propagation refuses an operator that mixes a CPU tensor
   with a device one ("FakeTensor is wrapped to wrong device"); moves between devices (``.to``, ``.cpu()``) are
   allowed, as on a GPU. FakeTensorMode lets a 0-dim CPU tensor into any operator, but CUDA takes one only as an
   operand of an elementwise (TensorIterator) operator: ``torch.stack`` of a CPU zero and CUDA scalars fails on a
   GPU. :class:`_DeviceRule` refuses that mix outside pointwise operators (issue 46: the pipeline's clip);
3. ``Module.to(meta)`` moves a model as ``Module.to("cuda")`` does: the same Parameter objects, their data on
   the device (a fake tensor's device is its ``fake_device``), so models are built on the CPU, as runs build
   them, and moved by the code under test;
4. reads of a value are answered: float64 scalars (the sums and counts slimpar reduces: the guard's count of
   bad ranks, losses, evaluation sums) read 0, other floats and integers 1 (AdamW's step count), truth tests
   True, ``numpy()`` zeros, and a unit's position in a neuron-level index list 0 (the slice sizes match).

What torch itself needs for a device that is not the CPU (FSDP2's streams, events and default mesh, barriers,
object gathers, autocast, fused AdamW's device list) is stubbed below; none of it is slimpar's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

DEVICE = torch.device("meta")
_SCALAR_OPS = {"aten::_local_scalar_dense", "aten::is_nonzero"}
# copies between devices: allowed, as on a GPU (``.to``, ``.cpu()``, ``copy_`` of a host tensor into a device one)
_MOVES = {"aten::_to_copy", "aten::copy_", "aten::copy", "aten::_copy_from", "aten::_copy_from_and_resize",
          "aten::lift_fresh", "aten::lift_fresh_copy"}


def _host_scalar_mix(func, tensors: list[torch.Tensor], device: torch.device) -> bool:
    """A 0-dim CPU tensor beside ``device`` tensors in an operator CUDA refuses it in. FakeTensorMode exempts such
    a scalar in every operator; CUDA only in elementwise ones (a TensorIterator operand): ``stack``, ``cat``,
    indexing and matrix products refuse it (\"Expected all tensors to be on the same device\")."""
    if device.type == "cpu" or func._schema.name in _MOVES or torch.Tag.pointwise in func.tags:
        return False  # a rule run on the CPU itself (tests/unit/test_sdp_eval_memory.py) has nothing to mix
    types = {t.device.type for t in tensors}
    return device.type in types and "cpu" in types


class _DeviceRule(TorchDispatchMode):
    """Refuses a c10d op (collective or point to point) given a tensor that is not on ``device`` (item 1 of the
    module docstring) and a host scalar where CUDA refuses one (item 2), and answers reads of fake values (item 4)."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(is_traceable_wrapper_subclass(t) for t in tensors):
            return NotImplemented
        if func.namespace in ("c10d", "_c10d_functional"):
            host = next((t.device.type for t in tensors if t.device.type != self.device.type), None)
            if host is not None:
                raise RuntimeError(f"{func} was given a {host} tensor, and the group takes {self.device.type} tensors "
                                   f"only, as NCCL takes CUDA tensors only (No backend type associated with device "
                                   f"type {host})")
        elif _host_scalar_mix(func, tensors, self.device):
            raise RuntimeError(f"Expected all tensors to be on the same device: {func} was given a cpu tensor beside "
                               f"{self.device.type} ones, which CUDA accepts in elementwise operators only")
        name = func._schema.name
        if name == "aten::equal":
            return True
        if name in _SCALAR_OPS:
            t = args[0]
            if name == "aten::is_nonzero" or t.dtype == torch.bool:
                return True
            if t.dtype == torch.float64:
                return 0.0
            return 1.0 if t.dtype.is_floating_point else 1
        return func(*args, **kwargs)


class _Event:
    def record(self, stream=None):
        return self

    def wait(self, stream=None) -> None:
        return None

    def synchronize(self) -> None:
        return None


class _Stream:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_event(self, event) -> None:
        return None

    def wait_stream(self, stream) -> None:
        return None

    def record_event(self, event=None) -> _Event:
        return _Event()


class _DeviceHandle:
    """What FSDP2 asks of ``torch.<device type>`` (``torch.cuda`` on a GPU): streams, events, the device."""

    Stream, Event = _Stream, _Event

    def __init__(self) -> None:
        self._stream = _Stream()

    def current_device(self) -> None:
        return None  # torch.device("meta", None): the stand-in has no device index

    def current_stream(self, device=None) -> _Stream:
        return self._stream

    def stream(self, stream) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def synchronize(self, device=None) -> None:
        return None


def _moved_in_place(to):
    """``Module.to(<stand-in>)`` as ``Module.to("cuda")`` does it: the same Parameter and buffer objects with their
    data on the device, so tied weights stay tied and references taken before the move stay valid."""

    def moved(self: nn.Module, *args, **kwargs) -> nn.Module:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None or device is None or device.type != DEVICE.type:
            return to(self, *args, **kwargs)
        for t in [*self.parameters(), *self.buffers()]:
            for u in (t, t.grad):
                if isinstance(u, FakeTensor):
                    u.fake_device = DEVICE
        return self

    return moved


def _empty_in_place(to_empty):
    """``Module.to_empty(device=...)`` of a fake module: fresh fake tensors of the same shapes there (torch would swap
    each fake parameter for one, which fails under FakeTensorMode); callers re-tie tied weights, as on a GPU."""

    def emptied(self: nn.Module, *, device, recurse: bool = True) -> nn.Module:
        if not any(isinstance(t, FakeTensor) for t in [*self.parameters(), *self.buffers()]):
            return to_empty(self, device=device, recurse=recurse)
        for module in self.modules() if recurse else [self]:
            for key, p in module._parameters.items():
                if p is not None:
                    module._parameters[key] = nn.Parameter(torch.empty_like(p, device=device), p.requires_grad)
            for key, b in module._buffers.items():
                if b is not None:
                    module._buffers[key] = torch.empty_like(b, device=device)
        return self

    return emptied


class _Autocast(torch.autocast):
    """``torch.autocast`` knows no ``meta`` device type: the stand-in's regions are autocast as the CPU's."""

    def __init__(self, device_type: str, *args, **kwargs):
        super().__init__("cpu" if device_type == DEVICE.type else device_type, *args, **kwargs)


def _host_copy(numpy):
    """``Tensor.numpy()`` of a fake tensor (a fingerprint's bytes): zeros of its shape and dtype."""

    def host(self: torch.Tensor, *args, **kwargs) -> np.ndarray:
        if isinstance(self, FakeTensor):
            return np.zeros(tuple(self.shape), dtype=np.dtype(str(self.dtype).removeprefix("torch.")))
        return numpy(self, *args, **kwargs)

    return host


def _first_unit(idx: torch.Tensor, unit: int) -> int:
    return 0


def _gather_own(obj, object_gather_list=None, dst=None, group=None, group_dst=None) -> None:
    """``gather_object`` on the fake backend: every rank's object is taken to be this one's."""
    if object_gather_list is not None:
        object_gather_list[:] = [obj] * len(object_gather_list)


@contextlib.contextmanager
def _torch_on_standin() -> Iterator[None]:
    """The stubs of the module docstring's last paragraph, and the answered reads of item 4."""
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as param_group
    import torch.distributed.fsdp._fully_shard._fully_shard as fully
    import torch.optim.optimizer as optimizer
    from torch.distributed.device_mesh import DeviceMesh

    import slimpar.sdp.gather as gather
    import slimpar.train.checkpoint.sdp_pieces as pieces
    from slimpar.train.memory.predict import _real

    patches = [
        (torch, "meta", _DeviceHandle()),  # FSDP2's device handle: torch.<device type>
        (param_group.FSDPParamGroup, "_validate_no_meta_params", lambda self: None),  # meta = not materialized
        (fully, "_init_default_mesh", _real(lambda: DeviceMesh.from_group(dist.group.WORLD, DEVICE.type))),
        (dist, "barrier", lambda *args, **kwargs: None),  # torch's: NCCL runs it on the bound device
        (dist, "gather_object", _gather_own),
        (nn.Module, "to", _moved_in_place(nn.Module.to)),
        (nn.Module, "to_empty", _empty_in_place(nn.Module.to_empty)),
        (torch, "autocast", _Autocast), (torch.amp, "autocast", _Autocast),
        (torch.Tensor, "numpy", _host_copy(torch.Tensor.numpy)),
        (optimizer, "_get_fused_kernels_supported_devices", lambda: ["cuda", "cpu", DEVICE.type]),  # fused AdamW
        (gather, "unit_position", _first_unit), (pieces, "unit_position", _first_unit),
    ]
    with contextlib.ExitStack() as stack:
        for owner, name, value in patches:
            stack.enter_context(mock.patch.object(owner, name, value, create=True))
        yield


@contextlib.contextmanager
def standin_accelerator(rank: int, world: int, device: torch.device = DEVICE) -> Iterator[torch.device]:
    """This process as rank ``rank`` of ``world`` on the stand-in device (the module docstring); yields it.
    ``device`` cpu: the same machinery on the CPU (``slimpar plan --memory``'s), where the memory accounting of
    slimpar.parallel.comm, which leaves meta tensors out, counts every tensor."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from slimpar.train.memory.predict import _fake_friendly

    if dist.is_initialized():
        raise RuntimeError("the stand-in accelerator needs a process without a process group")
    dist.init_process_group(f"{device.type}:fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        with _fake_friendly(), _torch_on_standin(), FakeTensorMode(allow_non_fake_inputs=True), _DeviceRule(device):
            yield device
    finally:
        dist.destroy_process_group()
