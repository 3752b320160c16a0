"""Virtual SDP in one batched pass (``sdp.virtual_batched = true``) behind the trainer's strategy interface.

As ``sdp.virtual`` (:class:`~slimpar.train.strategies.sdp_virtual.VirtualSDPStrategy`: N = ``sdp.virtual_workers``
simulated workers in one process, worker w reading the batch rank w of the N-process run reads), but on ONE copy
of the full model with one optimizer (:class:`slimpar.sdp.batched.BatchedSDP`). Each micro-batch concatenates the
N workers' batches worker-major and runs one forward and backward with every block (neuron level: every MLP's
hidden units) routed to its holders' rows; the loss is Σ_w (worker w's mean loss) / ``train.grad_accum``;
``after_backward`` divides each gradient by its holder count (shared parameters by N), which is the holder
average of the real run; then the global clip norm and AdamW on the one copy. Nothing is refreshed (the backward
regime equals ``refresh_every = 1``) and there are no replicas to check (``sdp.check_every`` is moot).

Equal to the sequential virtual run (and so to the N-process run) to rounding, not bit for bit
(tests/unit/test_sdp_batched.py). The logged loss is the mean of the N workers' losses. Evaluation and export
use a plain copy of the one model (with ``sdp.eval_rescale``). Checkpoints are the full-model format of single,
DDP and SDP runs (the model under its own names, AdamW's state by parameter name), so a batched run resumes a
sequential virtual, real SDP, single or DDP checkpoint and each of them resumes a batched one. Activation
checkpointing goes on after the routing (it recomputes the routed forward, so backward runs under the routing).
Bytes are the plan's analytic count, as for ``sdp.virtual``; memory is that of one model copy and the activations
of all N workers' rows.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from slimpar.parallel.ac import apply_ac, model_blocks
from slimpar.parallel.compile import apply_compile
from slimpar.sdp.batched import BatchedSDP
from slimpar.sdp.batched_routes import BlockRoute
from slimpar.train.build import train_loss
from slimpar.train.strategies.sdp_virtual import VirtualSDPStrategy


def _compile_routed(model: nn.Module, batched: BatchedSDP, backend: str) -> None:
    """A routed block compiles its own forward; the routing around it (row selection by block column) stays
    eager. Compiled whole, the route's column index and row lists are constants of the graph: one graph per block,
    past dynamo's limit of 8 per function at 134M's 12 blocks (the blocks after the eighth would run eager).
    Blocks that are not routed whole (neuron level) compile as in every other mode."""
    routes = [r for r in batched.routes if isinstance(r, BlockRoute)]
    for route in routes:
        route.original = torch.compile(route.original, backend=backend)
    routed = {id(r.block) for r in routes}
    apply_compile(nn.ModuleDict({k: b for k, b in model_blocks(model).items() if id(b) not in routed}), backend)


class BatchedVirtualSDPStrategy(VirtualSDPStrategy):
    def _wrap(self, model: nn.Module) -> BatchedSDP:
        model.to(self.ctx.device)
        batched = BatchedSDP(model, self.plan, regime=self.cfg.sdp.regime)
        self.loss = train_loss(self.cfg)  # compiled on its own where train.compile_scope = loss
        if self.cfg.train.activation_checkpointing:
            apply_ac(model_blocks(model))
        if self.cfg.train.compile:
            _compile_routed(model, batched, self.cfg.train.compile_backend)
        return batched

    def _container(self) -> nn.Module:
        return self.wrapper.model  # the one copy, under the full model's names

    @property
    def checkpoint_module(self):
        """The full model itself: the format single, DDP and (virtual or real) SDP runs write and read."""
        return self.model

    def train_step(self, step: int, batch_fn, record=contextlib.nullcontext) -> float:
        """Per micro-batch: the N workers' batches concatenated, one routed forward and backward."""
        acc, n = self.cfg.train.grad_accum, self.plan.world_size
        total = 0.0
        for micro in range(acc):
            xs, ys = [], []
            for w in range(n):
                self.dp_rank = w  # the trainer's batch_fn reads it: worker w's share of the global batch
                x, y = batch_fn(step, micro)
                xs.append(x)
                ys.append(y)
            self.dp_rank = 0
            with self.wrapper.rows([len(x) for x in xs]):
                with record(), self.autocast():
                    logits = self.model(torch.cat(xs))
                    losses = [self.loss(out, y) for out, y in zip(logits.split(self.wrapper.counts), ys, strict=True)]
                    loss = sum(losses) / acc
                loss.backward()  # under the routing: activation checkpointing recomputes routed forwards
            total = total + loss.detach().double() / n  # read once, by the trainer's guard
        return total

    def after_backward(self) -> None:
        self.wrapper.average_grads()

    def after_step(self) -> None:
        self._full = None  # one copy: nothing to refresh

    def end_of_step(self, step: int) -> None:
        """One copy: no replicas to compare."""

    def eval_module(self) -> nn.Module:
        if self._full is None:
            self._full = self.wrapper.full_model(self.ctx.device, self.cfg.sdp.eval_rescale)
        return self._full

    def extra_metrics(self) -> dict:
        return {**super().extra_metrics(), "virtual_batched": True}

    def _how(self) -> str:
        n = self.plan.world_size
        return (f"{n} workers simulated in one batched pass on one model copy: memory above is one copy and all "
                f"{n} workers' activations, bytes are the plan's analytic count")


def build_batched_virtual_sdp_strategy(cfg, model: nn.Module, ctx, run) -> BatchedVirtualSDPStrategy:
    if ctx.group is not None and ctx.world > 1:
        raise RuntimeError("sdp.virtual_batched = true simulates every worker in one process; run it with "
                           "--parallel.workers 1")
    return BatchedVirtualSDPStrategy(cfg, model, ctx, run)
