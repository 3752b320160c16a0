"""Every torch API newer than slimpar's floor (``slimpar.torch_range.FLOOR``, torch 2.11), reached by feature
detection in this one module: the rest of slimpar calls these helpers and never asks for a version.

Each helper names the torch release that added what it detects. Detection looks at the API itself (a keyword in
a signature, a field of a dataclass), not at version numbers, so a backport or a nightly build is handled too.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

from torch import nn

# torch's elastic agent waits this long for workers after a stop signal where LaunchConfig has no
# shutdown_timeout (the fixed default of PContext.close before torch 2.12)
AGENT_SHUTDOWN_FIXED_S = 30


@functools.cache
def _ddp_has_forward_sync_buffers() -> bool:
    from torch.nn.parallel import DistributedDataParallel as DDP

    return "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters


def ddp_buffer_sync(sync_each_forward: bool) -> dict[str, bool]:
    """DDP's keyword for "broadcast the buffers from rank 0 before every forward".

    torch 2.13 added ``forward_sync_buffers`` (``broadcast_buffers=False`` warns there); before it (2.11, 2.12) only
    ``broadcast_buffers`` exists. Either way the buffers are also broadcast once when DDP is built."""
    key = "forward_sync_buffers" if _ddp_has_forward_sync_buffers() else "broadcast_buffers"
    return {key: sync_each_forward}


def ddp_syncs_buffers_each_forward(module: nn.Module) -> bool:
    """What :func:`ddp_buffer_sync` set on a built DDP module, under either torch's attribute name."""
    return bool(getattr(module, "forward_sync_buffers", getattr(module, "broadcast_buffers", None)))


@functools.cache
def _launch_config_fields() -> frozenset[str]:
    from torch.distributed.launcher.api import LaunchConfig

    return frozenset(f.name for f in dataclasses.fields(LaunchConfig))


def launch_config(shutdown_timeout: int, **kwargs: Any):
    """torch's elastic ``LaunchConfig`` whose agent waits ``shutdown_timeout`` seconds for stopped workers.

    ``LaunchConfig.shutdown_timeout`` came with torch 2.12; before it the agent waits a fixed
    :data:`AGENT_SHUTDOWN_FIXED_S` seconds. :func:`agent_shutdown_s` says which wait a launch gets."""
    from torch.distributed.launcher.api import LaunchConfig

    if "shutdown_timeout" in _launch_config_fields():
        kwargs["shutdown_timeout"] = shutdown_timeout
    return LaunchConfig(**kwargs)


def agent_shutdown_s(wanted: int) -> int:
    """The seconds torch's elastic agent will really wait for stopped workers when ``wanted`` is asked for."""
    return wanted if "shutdown_timeout" in _launch_config_fields() else AGENT_SHUTDOWN_FIXED_S
