"""Mixed precision applied from outside a model (models stay single-device fp32 code).

- :func:`autocast_forward`: a module's forward runs under autocast while the module trains; its backward,
  and anything outside that forward (a pipeline's boundary codecs, the optimizer), keeps fp32. Used where
  a forward is not called by code of ours (a ``torch.distributed.pipelining`` schedule calls the stage).
- :func:`fsdp_kwargs`: FSDP2's ``mp_policy`` argument, or none.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class AutocastForward:
    """A module's forward, called under ``torch.autocast`` while the module is in training mode.

    Stored as the instance's ``forward`` (a plain object holding the bound method, so ``copy.deepcopy`` of
    the module rebinds it to the copy); evaluation (``module.eval()``) runs the forward as it was.
    """

    def __init__(self, forward: Callable, device_type: str, dtype: torch.dtype):
        self.forward, self.device_type, self.dtype = forward, device_type, dtype

    def __call__(self, *args, **kwargs):
        if not self.forward.__self__.training:
            return self.forward(*args, **kwargs)
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.forward(*args, **kwargs)


def autocast_forward(module: nn.Module, device_type: str, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """Make ``module``'s training forward run under autocast ``dtype`` on ``device_type`` (in place)."""
    module.forward = AutocastForward(module.forward, device_type, dtype)
    return module


def fsdp_kwargs(mp_policy) -> dict:
    """``fully_shard`` keyword arguments for an optional ``MixedPrecisionPolicy``."""
    return {"mp_policy": mp_policy} if mp_policy is not None else {}
