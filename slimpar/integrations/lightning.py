"""Subnetwork data parallelism as a PyTorch Lightning strategy (Lightning 2.6).

A Lightning user swaps the strategy (docs/integrations.md)::

    from slimpar.integrations.lightning import SDPArguments, SDPStrategy
    trainer = L.Trainer(strategy=SDPStrategy(SDPArguments(keep=0.5)), accelerator="cpu", devices=2, ...)

``SDPStrategy`` subclasses ``DDPStrategy`` (process group, ranks, distributed samplers, barriers and reductions
stay Lightning's) and changes it at the strategy's extension points:

- ``configure_ddp``: instead of wrapping the LightningModule in DDP, the network at ``module`` (an attribute of
  the LightningModule, default ``model``) is planned and cut into this rank's subnetwork in place
  (:func:`~slimpar.integrations.common.wrap_model`); Lightning then builds the optimizers over the held
  parameters, and ``training_step`` runs the subnetwork directly;
- ``block_backward_sync`` (gradient accumulation) disables the holder-set averaging; ``post_backward`` finishes it
  after the backward that ends a step, before Lightning clips and steps;
- clipping by norm (``gradient_clip_val``) uses the norm of the full model's averaged gradient (one scalar
  all-reduce), the same on every rank: the precision plugin's ``clip_grad_by_norm``, which Lightning calls, is
  pointed at SDP's;
- ``optimizer_step``: then the backward regime's refresh, and replica checks if asked;
- validation, test and prediction run the full network gathered from its holders (collective), swapped in for
  the loop and back;
- checkpoints: ``lightning_module_state_dict`` is the full model's (so ``load_from_checkpoint`` gives the full
  model), ``optimizer_state`` collects every rank's optimizer state (each holds its subnetwork's) with the plan's
  mask, and ``load_optimizer_state_dict`` gives each rank its own; a resume needs the same ranks and plan.
  Lightning restores the weights before ``setup``, so a resumed run loads the full model and then cuts it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import DDPStrategy
from torch import nn

from slimpar.integrations.common import SDPArguments, wrap_model
from slimpar.sdp.wrapper import SubnetworkDataParallel

__all__ = ["SDPArguments", "SDPStrategy"]


class SDPStrategy(DDPStrategy):
    """Lightning's DDP strategy with SDP's cut and communication (module docstring). ``sdp``: SDP's options;
    ``module``: the dotted attribute of the LightningModule that holds the network to cut; further keywords go
    to ``DDPStrategy`` (e.g. ``process_group_backend``)."""

    strategy_name = "sdp"

    def __init__(self, sdp: SDPArguments | None = None, module: str = "model", **kwargs: Any):
        super().__init__(**kwargs)
        self.sdp_args = sdp if sdp is not None else SDPArguments()
        self.module_name = module
        self.sdp: SubnetworkDataParallel | None = None
        self._accumulating = False
        self._full: nn.Module | None = None
        self._swap = contextlib.ExitStack()  # the full network, swapped in from an evaluation's start to its end
        self._steps = 0

    # -- the cut, in place of DDP ----------------------------------------------------------------------
    def configure_ddp(self) -> None:
        if self.sdp is None:  # a later fit() in the same process keeps the cut
            self.sdp = wrap_model(self.lightning_module.get_submodule(self.module_name), self.sdp_args)

    def setup_precision_plugin(self) -> None:
        super().setup_precision_plugin()
        self.precision_plugin.clip_grad_by_norm = self._clip_grad_by_norm  # Lightning's norm would be local

    def _clip_grad_by_norm(self, optimizer, clip_val: float) -> None:
        if self.sdp is None:
            torch.nn.utils.clip_grad_norm_(self.precision_plugin.main_params(optimizer), clip_val)
        else:
            self.sdp.clip_grad_norm_(float(clip_val))

    # -- one step --------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def block_backward_sync(self) -> Iterator[None]:
        if self.sdp is None:
            yield
            return
        self._accumulating = True
        try:
            with self.sdp.no_sync():
                yield
        finally:
            self._accumulating = False

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        if self.sdp is not None and not self._accumulating:
            self.sdp.sync()

    def optimizer_step(self, optimizer, closure, model=None, **kwargs: Any) -> Any:
        out = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self.sdp is not None:
            self.sdp.refresh()  # backward regime only; a no-op otherwise
            self._full = None
            self._steps += 1
            k = self.sdp_args.check_every
            if k and self._steps % k == 0:
                self.sdp.check_replicas()
        return out

    # -- evaluation on the full network ----------------------------------------------------------------
    def full_network(self) -> nn.Module:
        """The full network gathered from its holders (collective), cached until the next optimizer step."""
        if self._full is None:
            self._full = self.sdp.gather_full_model(self.root_device)
        return self._full

    @contextlib.contextmanager
    def full_model_in_place(self) -> Iterator[None]:
        """The LightningModule holds the full network inside the block (collective on entry)."""
        if self.sdp is None:
            yield
            return
        cut = self.lightning_module.get_submodule(self.module_name)
        _set_submodule(self.lightning_module, self.module_name, self.full_network())
        try:
            yield
        finally:
            _set_submodule(self.lightning_module, self.module_name, cut)

    def _swap_in(self) -> None:
        self._swap.enter_context(self.full_model_in_place())
        if self._full is not None:
            self._full.eval()  # Lightning set eval mode before this hook, on the cut network

    def _swap_out(self) -> None:
        self._swap.close()

    on_validation_start = on_test_start = on_predict_start = _swap_in
    on_validation_end = on_test_end = on_predict_end = _swap_out

    # -- checkpoints -----------------------------------------------------------------------------------
    def lightning_module_state_dict(self) -> dict[str, Any]:
        with self.full_model_in_place():
            return super().lightning_module_state_dict()

    def optimizer_state(self, optimizer) -> dict[str, Any]:
        """Every rank's optimizer state (collective), with the plan's mask."""
        if self.sdp is None:
            return super().optimizer_state(optimizer)
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        states: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(states, optimizer.state_dict())
        return {"sdp_mask": self.sdp.plan.mask.tolist(), "sdp_rank_states": states}

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        if self.sdp is None:
            return super().load_optimizer_state_dict(checkpoint)
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"], strict=True):
            if state.get("sdp_mask") != self.sdp.plan.mask.tolist():
                raise ValueError(f"the checkpoint was written under another SDP plan (mask {state.get('sdp_mask')}, "
                                 f"now {self.sdp.plan.mask.tolist()}): resume with the same SDPArguments and ranks")
            optimizer.load_state_dict(state["sdp_rank_states"][dist.get_rank()])


def _set_submodule(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)
