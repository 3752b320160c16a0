"""Subnetwork data parallelism inside Hugging Face's ``transformers.Trainer`` (transformers 5).

A Trainer user turns SDP on with one import and one argument (docs/integrations.md)::

    from slimpar.integrations.hf import SDPArguments, SDPTrainer
    trainer = SDPTrainer(model=model, args=args, train_dataset=train, sdp=SDPArguments(keep=0.5))

or hands it a model already wrapped in ``slimpar.SubnetworkDataParallel`` (then it cannot resume: the model is
cut before Trainer could load a checkpoint into it).

Launched with ``torchrun``, Trainer would wrap the model in DDP, which fails for SDP (the ranks hold
different parameters). ``SDPTrainer`` changes the steps of Trainer's loop that SDP changes, and nothing else:

- the cut: when Trainer first creates its optimizer, the full model (loaded from a checkpoint first, when
  resuming) is planned and cut into this rank's subnetwork (:func:`~slimpar.integrations.common.wrap_model`),
  so the optimizer holds state for the held parameters only;
- ``_wrap_model`` hands Trainer the SDP module, so Trainer prepares only the optimizer with Accelerate (its path
  for models it wrapped itself): no DDP;
- gradient accumulation: Trainer's ``accelerator.no_sync(model)`` reaches the module's ``no_sync``; after the
  backward that ends a step, ``training_step`` finishes the holder-set averaging (``sync``);
- clipping: by the norm of the full model's averaged gradient (one scalar all-reduce), the same on every rank;
- after each optimizer step (an optimizer hook): the backward regime's refresh, replica checks if asked;
- evaluation, ``save_model`` and checkpoints see the full model gathered from its holders (collective: Trainer
  calls them on every rank), so ``model.safetensors`` loads with ``from_pretrained``;
- checkpoints keep each rank's optimizer state (its subnetwork's) in ``optimizer_sdp.rank{r}.pt`` with the
  plan's mask; a resume needs the same number of ranks and plan, and says so otherwise.

Not supported: ``optimizers=(optimizer, ...)`` (the optimizer must be built after the cut: pass
``optimizer_cls_and_kwargs``), ``load_best_model_at_end`` and resuming a Trainer whose model is already cut.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from transformers import Trainer

from slimpar.integrations.common import SDPArguments, wrap_model
from slimpar.sdp.wrapper import SubnetworkDataParallel

__all__ = ["SDPArguments", "SDPTrainer"]

SCHEDULER_NAME = "scheduler.pt"  # Trainer's own name, so its resume finds the file


class SDPTrainer(Trainer):
    """``transformers.Trainer`` training this rank's SDP subnetwork (module docstring); ``sdp``: SDP's options."""

    def __init__(self, *args: Any, sdp: SDPArguments | None = None, **kwargs: Any):
        if kwargs.get("optimizers", (None, None))[0] is not None:
            raise ValueError("SDPTrainer creates the optimizer after cutting each rank's subnetwork; pass "
                             "optimizer_cls_and_kwargs=(cls, kwargs) instead of optimizers=(optimizer, ...)")
        wrapped = kwargs.get("model", args[0] if args else None)
        if isinstance(wrapped, SubnetworkDataParallel):  # cut by the caller: Trainer gets the subnetwork itself
            if "model" in kwargs:
                kwargs["model"] = wrapped.module
            else:
                args = (wrapped.module, *args[1:])
        super().__init__(*args, **kwargs)
        if self.args.load_best_model_at_end:
            raise ValueError("SDPTrainer does not support load_best_model_at_end (a checkpoint holds the full "
                             "model, which the cut subnetwork cannot load in place)")
        self.sdp_args = sdp if sdp is not None else SDPArguments()
        # set at the cut; a model the caller wrapped is cut already (it cannot resume from a checkpoint then)
        self.sdp: SubnetworkDataParallel | None = wrapped if isinstance(wrapped, SubnetworkDataParallel) else None
        self._full: nn.Module | None = None  # the gathered full model, until the next optimizer step
        self._steps = 0

    # -- the cut ---------------------------------------------------------------------------------------
    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        if self.sdp is None:
            self.sdp = wrap_model(self.model, self.sdp_args)  # self.model is now this rank's subnetwork
        if self.optimizer is not None:  # a second train(): the optimizer and its hook exist
            return self.optimizer
        optimizer = super().create_optimizer()
        optimizer.register_step_post_hook(self._after_optimizer_step)
        return optimizer

    def _wrap_model(self, model: nn.Module, training: bool = True, dataloader=None) -> nn.Module:
        if self.sdp is None:  # before training: the full model, as Trainer has it
            return super()._wrap_model(model, training, dataloader)
        return self.sdp if training else self.full_model()

    def full_model(self) -> nn.Module:
        """The full model, each component from one holder (collective: every rank calls); cached until the
        next optimizer step. Before training, the model itself."""
        if self.sdp is None:
            return self.model
        if self._full is None:
            self._full = self.sdp.gather_full_model(self.args.device)
        return self._full

    # -- one step --------------------------------------------------------------------------------------
    def training_step(self, model: nn.Module, inputs: dict, num_items_in_batch=None) -> torch.Tensor:
        loss = super().training_step(model, inputs, num_items_in_batch)
        sync = self.sdp.grad_sync if self.sdp is not None else None
        if sync is not None and sync.enabled:  # not inside Trainer's no_sync: this backward ended the step
            self.sdp.sync()
        return loss

    def _clip_grad_norm(self, model: nn.Module):
        if self.sdp is None:
            return super()._clip_grad_norm(model)
        return self.sdp.clip_grad_norm_(self.args.max_grad_norm)

    def _get_grad_norm(self, model: nn.Module, grad_norm=None):
        if self.sdp is not None and grad_norm is None:  # no clipping asked: the norm alone (max_norm 0)
            return self.sdp.clip_grad_norm_(0.0)
        return super()._get_grad_norm(model, grad_norm)

    def _after_optimizer_step(self, *_: Any) -> None:
        self.sdp.refresh()  # backward regime: non-held copies from their holders (a no-op otherwise)
        self._full = None
        self._steps += 1
        k = self.sdp_args.check_every
        if k and self._steps % k == 0:
            self.sdp.check_replicas()

    # -- saving and resuming ---------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The full model, gathered on every rank and written by the main process (``from_pretrained`` loads it)."""
        if self.sdp is None:
            return super().save_model(output_dir, _internal_call)
        full = self.full_model()
        cut, self.model = self.model, full
        try:
            super().save_model(output_dir, _internal_call)
        finally:
            self.model = cut

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if self.sdp is None:
            return super()._save_optimizer_and_scheduler(output_dir)
        os.makedirs(output_dir, exist_ok=True)
        state = {"mask": torch.as_tensor(self.sdp.plan.mask), "optimizer": self.optimizer.state_dict()}
        torch.save(state, _optimizer_file(output_dir, self.args.process_index))
        if self.args.should_save:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        if self.sdp is not None:
            raise RuntimeError("this SDPTrainer's model is already cut into a subnetwork; resume with a new "
                               "SDPTrainer built on the full model")
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None or self.sdp is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        path = _optimizer_file(checkpoint, self.args.process_index)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} is missing: an SDP checkpoint holds one optimizer file per rank, "
                                    "so it resumes with the number of ranks that wrote it")
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not torch.equal(state["mask"], torch.as_tensor(self.sdp.plan.mask)):
            raise ValueError(f"{checkpoint} was written under another SDP plan (mask {state['mask'].tolist()}, "
                             f"now {self.sdp.plan.mask.tolist()}): resume with the same SDPArguments and ranks")
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True))


def _optimizer_file(folder: str, rank: int) -> str:
    return os.path.join(folder, f"optimizer_sdp.rank{rank}.pt")
