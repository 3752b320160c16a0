"""The one interface between the training loop and every parallel mode, and its simple strategies.

The trainer talks only to a :class:`Strategy` and probes nothing: every strategy (single process, DDP,
FSDP2 here; SDP, virtual SDP, pipelines and the SDP × pipeline hybrid in the sibling modules) has every
method below, with the default meaning "nothing special". One training step is

    build_optimizer(cfg) (once) · train_step(step, batch_fn, record) · after_backward() · clip_grad_norm()
    · optimizer step · after_step() · end_of_step(step) · reduce_loss(loss) · step_metrics()

and a run ends with ``evaluate``, ``full_state_dict`` (export), ``summary_extras`` and ``summary_rows``.
``checkpoint_module`` is what DCP saves; ``dp_rank`` / ``dp_world`` say which share of the global batch
this process reads.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from slimpar.parallel.compat import ddp_buffer_sync
from slimpar.parallel.device import group_device
from slimpar.parallel.precision import fsdp_kwargs
from slimpar.train.build import build_optimizer, compiles_blocks, forward_loss

BatchFn = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # (step, micro-batch) -> (inputs, targets)
Recorder = Callable[[], contextlib.AbstractContextManager]  # wraps a forward (activation accounting)


class Strategy:
    """Single-process training: communication is a no-op. The defaults of the interface live here."""

    name = "single"
    eval_sharded = True  # each rank may evaluate a different share of the validation batches
    loss_on_this_rank = True  # False for pipeline stages before the last: they have no loss of their own

    def __init__(self, model: nn.Module, group: dist.ProcessGroup | None = None, cfg=None):
        self.model = model
        self.module: nn.Module = model
        self.group = group
        self.cfg = cfg
        self.dp_rank = dist.get_rank(group) if group is not None else 0
        self.dp_world = dist.get_world_size(group) if group is not None else 1
        self._forward_loss = None  # built at the first step, over the wrapped module (train.compile_scope)

    # -- parameters, optimizer, checkpoints ---------------------------------------------------------
    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def build_optimizer(self, cfg) -> torch.optim.Optimizer:
        """AdamW with decay on matrices only (pipelines add SPEL for the Stiefel projectors)."""
        return build_optimizer(self.named_parameters(), cfg)

    @property
    def checkpoint_module(self) -> nn.Module:
        """What DCP saves (SDP: one full copy under the model's own names)."""
        return self.module

    # -- one step -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        yield

    def train_step(self, step: int, batch_fn: BatchFn, record: Recorder = contextlib.nullcontext) -> torch.Tensor:
        """Forward and backward of this rank's share of the global batch, ``train.grad_accum`` micro-batches
        (gradients communicated on the last only); ``record()`` wraps each forward (activation accounting).
        Returns this rank's loss as a float64 scalar on the device: the trainer reads it once, with the guard's
        other numbers (a read per micro-batch would make a GPU wait for each)."""
        acc, total = self.cfg.train.grad_accum, 0.0
        for micro in range(acc):
            x, y = batch_fn(step, micro)
            sync = contextlib.nullcontext() if micro == acc - 1 else self.no_sync()
            with sync:
                with record(), self.autocast():
                    loss = self.forward_loss(x, y) / acc
                loss.backward()
            total = total + loss.detach().double()
        return total

    def forward_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss of ``self.module`` on (x, y), compiled as ``train.compile_scope`` says (build.forward_loss)."""
        if self._forward_loss is None:
            self._forward_loss = forward_loss(self.cfg, self.module)
        return self._forward_loss(x, y)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.cfg is not None and self.cfg.train.dtype == "bf16":
            device = next(self.model.parameters()).device
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def after_backward(self) -> None:
        """Finish gradient communication before the optimizer step."""

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip the gradients by their global norm; returns the norm as a device scalar (not read here)."""
        norm = torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: the norm over every shard

    def after_step(self) -> None:
        """Work after the optimizer step (e.g. SDP's backward-masking refresh)."""

    def end_of_step(self, step: int) -> None:
        """Checks after a whole step (e.g. SDP's replica check every ``sdp.check_every`` steps)."""

    def reduce_loss(self, value: float, mean: float | None = None) -> float:
        """The mean of every rank's loss (the same on every rank): ``mean``, where the step's guard already
        summed the ranks' losses in its all-reduce."""
        if mean is not None and math.isfinite(mean):
            return mean
        if self.group is None:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=group_device(self.group))  # NCCL: CUDA only
        dist.all_reduce(t, group=self.group)
        return float(t) / dist.get_world_size(self.group)

    def step_metrics(self) -> dict:
        """Extra fields of a logged step's metrics line."""
        return {}

    def extra_metrics(self) -> dict:
        """Extra fields of the instrumented step's per-rank record."""
        return {}

    # -- evaluation, export, summary ------------------------------------------------------------------
    def eval_module(self) -> nn.Module:
        return self.model

    def evaluate(self, data, cfg) -> dict:
        """Validation losses (collective over the group)."""
        from slimpar.train.evaluate import evaluate

        world = dist.get_world_size(self.group) if self.group is not None else 1
        rank = dist.get_rank(self.group) if self.group is not None else 0
        return evaluate(self, data, cfg, rank, world, self.group)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full model's parameters and persistent buffers (every rank calls; rank 0 uses it)."""
        return dict(self.model.state_dict())  # detached views; tied weights stay one tensor

    def summary_extras(self) -> dict:
        """Extra fields of summary.json."""
        return {}

    def summary_rows(self, summary: dict) -> list[tuple[str, str]]:
        """Extra rows of the closing table."""
        return []

    def startup_note(self) -> str | None:
        """A line the trainer prints once before the first step (the main process): None, or the strategy's."""
        return None

    def val_gap_fix(self) -> str:
        """What to try when validation loss is far above training loss (the run's closing warning)."""
        return ("the model may overfit, or the validation data differ from the training data (data.*); "
                "compare the training and validation curves with eval.every")


class DDPStrategy(Strategy):
    """torch DDP. ``gradient_as_bucket_view`` makes gradients views of DDP's buckets, which saves a
    copy of the gradients and lets memory accounting see the buckets as the gradients they are."""

    name = "ddp"

    def __init__(self, model: nn.Module, group: dist.ProcessGroup | None = None, cfg=None):
        super().__init__(model, group, cfg)
        from torch.nn.parallel import DistributedDataParallel as DDP

        # Buffers are broadcast from rank 0 each forward only where they carry state (BatchNorm
        # statistics); LLaMA's rotary tables are constants and would only add traffic. Buffers are still
        # synced once at init. The keyword's name depends on the torch (parallel/compat.py).
        has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
        self.module = DDP(model, process_group=group, gradient_as_bucket_view=True, **ddp_buffer_sync(has_bn))

    def no_sync(self):
        return self.module.no_sync()


class FSDPStrategy(Strategy):
    """FSDP2: ``fully_shard`` on every block, then on the root (torchtitan's order); with ``train.dtype`` bf16,
    a ``MixedPrecisionPolicy`` that gathers bf16 parameters and reduce-scatters gradients in fp32."""

    name = "fsdp"
    eval_sharded = False  # FSDP2's forward all-gathers: every rank must run every batch

    def __init__(self, model: nn.Module, blocks: nn.ModuleDict, mesh=None, group=None, cfg=None):
        super().__init__(model, group, cfg)
        from torch.distributed.fsdp import fully_shard

        kw = fsdp_kwargs(mixed_precision_policy(cfg))
        for block in blocks.values():
            fully_shard(block, mesh=mesh, **kw)
        fully_shard(model, mesh=mesh, **kw)
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


def mixed_precision_policy(cfg):
    """FSDP2's policy for ``train.dtype`` bf16 (bf16 parameters in forward and backward, fp32 gradient
    reduction and fp32 sharded parameters for the optimizer), or None for fp32."""
    if cfg is None or cfg.train.dtype != "bf16":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def build_plain_strategy(cfg, model: nn.Module, ctx, run=None) -> Strategy:
    """``parallel.mode`` single, ddp or fsdp: activation checkpointing, then torch's wrapper."""
    from slimpar.parallel.ac import apply_ac, model_blocks
    from slimpar.parallel.compile import apply_compile

    if cfg.train.activation_checkpointing:
        apply_ac(model_blocks(model))
    if compiles_blocks(cfg):
        apply_compile(model_blocks(model), cfg.train.compile_backend)
    model.to(ctx.device)
    if cfg.parallel.mode == "ddp":
        return DDPStrategy(model, ctx.group, cfg)
    if cfg.parallel.mode == "fsdp":
        return FSDPStrategy(model, model_blocks(model), group=ctx.group, cfg=cfg)
    return Strategy(model, ctx.group, cfg)
