"""The device a process group communicates on, so callers create the tensors they hand it there.

NCCL reduces and sends CUDA tensors only: a CPU tensor makes it raise ("No backend type associated with
device type cpu" for a group bound to CUDA alone). gloo takes CPU tensors (and CUDA ones for its
collectives, not its sends). A group knows which device types it has a backend for
(``ProcessGroup._device_types``: ``[cuda]`` for NCCL, ``[cuda, cpu]`` for gloo); :func:`group_device` reads
it, so a scalar or a small buffer made for a collective (a count, a loss, a fingerprint) is created on the
group's device and no caller has to carry the run's device to where it communicates. Tensors computed from
parameters or gradients are already on the model's device, which is the group's in every supported setup
(NCCL with CUDA models, gloo with CPU or CUDA ones). docs/gpu.md states the rule and how the CPU tests
prove it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without making the host wait for the device's queue (a blocking copy from the
    host synchronises the stream after it): for a GPU through pinned memory, for another accelerator as a
    non-blocking copy; a tensor already off the host, or bound for it, as ``Tensor.to`` moves it."""
    if t.device.type != "cpu" or device.type == "cpu":
        return t.to(device)
    if device.type != "cuda":
        return t.to(device, non_blocking=True)
    return t.pin_memory().to(device, non_blocking=True)


def group_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where ``group``'s collectives take their tensors: the CPU where its backend takes CPU tensors (gloo)
    or there is no group, else its one device type (NCCL: the bound CUDA device, or the current one)."""
    if group is None:
        return torch.device("cpu")
    types = [d.type for d in group._device_types]
    if not types or "cpu" in types:
        return torch.device("cpu")
    bound = getattr(group, "bound_device_id", None)
    if bound is not None and bound.type == types[0]:
        return bound
    if types[0] == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(types[0])


def cuda_memory(device: torch.device) -> dict:
    """``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` of ``device`` (empty off a GPU)."""
    if device.type != "cuda":
        return {}
    return {"cuda_max_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "cuda_max_reserved_bytes": torch.cuda.max_memory_reserved(device)}


def send(t: torch.Tensor, group: dist.ProcessGroup, group_dst: int) -> None:
    """``dist.send`` of ``t`` from the group's device. gloo's sends take CPU tensors only: a CUDA tensor reaches its
    TCP transport as a device pointer ("writev ...: Bad address", 4 cuda:gloo ranks on one H200), so over gloo a
    GPU tensor travels through a host copy; NCCL sends it as it is."""
    dev = group_device(group)
    dist.send(t if t.device == dev else t.to(dev), group=group, group_dst=group_dst)


def recv(t: torch.Tensor, group: dist.ProcessGroup, group_src: int) -> None:
    """``dist.recv`` into ``t``, through a buffer on the group's device where ``t`` is elsewhere (:func:`send`)."""
    dev = group_device(group)
    if t.device == dev:
        dist.recv(t, group=group, group_src=group_src)
        return
    buf = torch.empty(t.shape, dtype=t.dtype, device=dev)
    dist.recv(buf, group=group, group_src=group_src)
    t.copy_(buf)
