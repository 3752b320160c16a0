"""Data-parallel strategies behind one small interface: single process, torch DDP, FSDP2.

The trainer only talks to a :class:`Strategy`: call ``module`` forward, ``backward``, then
``after_backward()`` and the optimizer; ``eval_module()`` for validation and ``full_state_dict()``
for export. SDP (slimpar.sdp) implements the same interface.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn


class Strategy:
    """Single-process training: communication is a no-op."""

    name = "single"
    eval_sharded = True  # each rank may evaluate a different share of the validation batches

    def __init__(self, model: nn.Module, group: dist.ProcessGroup | None = None):
        self.model = model
        self.module: nn.Module = model
        self.group = group

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        yield

    def after_backward(self) -> None:
        """Finish gradient communication before the optimizer step."""

    def after_step(self) -> None:
        """Work after the optimizer step (e.g. SDP's backward-masking refresh)."""

    def eval_module(self) -> nn.Module:
        return self.model

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full model's parameters and persistent buffers (every rank calls; rank 0 uses it)."""
        return dict(self.model.state_dict())  # detached views; tied weights stay one tensor

    def clip_grad_norm(self, max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm))

    def extra_metrics(self) -> dict:
        return {}


class DDPStrategy(Strategy):
    """torch DDP. ``gradient_as_bucket_view`` makes gradients views of DDP's buckets, which saves a
    copy of the gradients and lets memory accounting see the buckets as the gradients they are."""

    name = "ddp"

    def __init__(self, model: nn.Module, group: dist.ProcessGroup | None = None):
        super().__init__(model, group)
        from torch.nn.parallel import DistributedDataParallel as DDP

        # Buffers are broadcast from rank 0 each forward only where they carry state (BatchNorm
        # statistics); LLaMA's rotary tables are constants and would only add traffic.
        has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
        self.module = DDP(model, process_group=group, gradient_as_bucket_view=True, broadcast_buffers=has_bn)

    def no_sync(self):
        return self.module.no_sync()


class FSDPStrategy(Strategy):
    """FSDP2: ``fully_shard`` on every block, then on the root (torchtitan's order)."""

    name = "fsdp"
    eval_sharded = False  # FSDP2's forward all-gathers: every rank must run every batch

    def __init__(self, model: nn.Module, blocks: nn.ModuleDict, mesh=None):
        super().__init__(model, None)
        from torch.distributed.fsdp import fully_shard

        for block in blocks.values():
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.module = model

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)

    def eval_module(self) -> nn.Module:
        return self.module

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.module, options=opts)
