"""SDP simulated in one process (``sdp.virtual = true``) behind the trainer's strategy interface.

``parallel.workers`` is 1 (one process); ``sdp.virtual_workers`` = N is the number of simulated
workers. ``train_step`` runs worker 0..N-1 one after another, each on the batch that rank w of the
N-process run reads (the trainer's ``batch_fn`` with ``dp_rank = w``, ``dp_world = N``), with the
same gradient accumulation and autocast as the trainer's own forward/backward; the holder averaging,
clipping, refresh and gather are :class:`slimpar.sdp.virtual.VirtualSDP`'s. The trainer's single
optimizer over all N workers' parameters is N per-worker AdamWs (AdamW is elementwise, and every
worker's parameters land in the same decay/no-decay groups as in its own process). The logged loss
is the mean of the N workers' losses, as the real run's all-reduce gives. Evaluation, export and the
summary come from :class:`~slimpar.train.strategies.sdp.SDPStrategy` on the gathered full model.

Bytes: nothing is sent, so the run reports the plan's analytic count per worker (``analytic_bytes``
= the mean over workers, as ``comm_bytes_per_step`` is a mean over ranks in a real run; the list per
worker beside it). Memory measured in this process is that of all N workers together, not a worker's.
"""

from __future__ import annotations

import contextlib

from torch import nn

from slimpar.parallel.ac import apply_ac, model_blocks
from slimpar.parallel.compile import apply_compile
from slimpar.sdp.plan import analytic_bytes_per_step
from slimpar.sdp.virtual import VirtualSDP
from slimpar.train.build import compiles_blocks, forward_loss
from slimpar.train.strategies.sdp import SDPStrategy
from slimpar.train.strategies.sdp_plan import refresh_root_bytes


class VirtualSDPStrategy(SDPStrategy):
    name = "sdp"
    eval_sharded = True
    eval_dst = None  # every worker lives here: the gather is local

    def __init__(self, cfg, model: nn.Module, ctx, run):
        super().__init__(cfg, model, ctx, run)  # the plan over sdp.virtual_workers, then _wrap
        self.model = self._container()
        self.module = self.model
        self.group = None  # one process: nothing to reduce
        self.dp_rank, self.dp_world = 0, self.plan.world_size

    def _container(self) -> nn.Module:
        """Worker w's parameters as worker{w}.module.<name> (the trainer's one optimizer is over all of them)."""
        return nn.ModuleDict({f"worker{w}": nn.ModuleDict({"module": m}) for w, m in enumerate(self.wrapper.modules)})

    def _workers(self) -> int:
        return self.cfg.sdp.virtual_workers

    def _wrap(self, model: nn.Module) -> VirtualSDP:
        cfg = self.cfg

        def parallelize(m: nn.Module) -> None:
            if cfg.train.activation_checkpointing:
                apply_ac(model_blocks(m))
            if compiles_blocks(cfg):
                apply_compile(model_blocks(m), cfg.train.compile_backend)

        self.shapes = {k: tuple(t.shape) for k, t in model.state_dict().items()}  # before the subnetworks are cut
        return VirtualSDP(model, self.plan, regime=cfg.sdp.regime, refresh_every=cfg.sdp.refresh_every,
                          device=self.ctx.device, parallelize=parallelize)

    @property
    def checkpoint_module(self):
        """The real SDP run's checkpoint format: one copy of the full model and its optimizer state under
        the model's own names (slimpar.train.checkpoint.sdp), so a real run resumes it and it resumes theirs."""
        from slimpar.train.checkpoint.dcp import OPTIONS
        from slimpar.train.checkpoint.sdp import VirtualSDPFullState

        return VirtualSDPFullState(self.wrapper, self.model, self.shapes, OPTIONS)

    def no_sync(self):
        return contextlib.nullcontext()

    def train_step(self, step: int, batch_fn, record=contextlib.nullcontext):
        """Every worker's forward and backward on its own batch (then the trainer calls ``after_backward``)."""
        acc = self.cfg.train.grad_accum
        totals = []
        for w, m in enumerate(self.wrapper.modules):
            self.dp_rank = w  # the trainer's batch_fn reads it: worker w's share of the global batch
            total = 0.0
            for micro in range(acc):
                x, y = batch_fn(step, micro)
                with record(), self.autocast():
                    loss = self._worker_loss(w, m)(x, y) / acc
                loss.backward()
                total = total + loss.detach().double()  # read once, by the trainer's guard
            totals.append(total)
        self.dp_rank = 0
        return sum(totals) / len(totals)

    def _worker_loss(self, w: int, m: nn.Module):
        """Worker ``w``'s forward and loss, compiled as ``train.compile_scope`` says (one function per worker)."""
        cache = self.__dict__.setdefault("_worker_losses", {})
        if w not in cache:
            cache[w] = forward_loss(self.cfg, m)
        return cache[w]

    def extra_metrics(self) -> dict:
        """The plan's analytic bytes (nothing is sent in one process), as the real run would count them."""
        clip = 8 if self.cfg.train.grad_clip and self.plan.world_size > 1 else 0
        per_worker = [analytic_bytes_per_step(self.plan, w)["total"] + clip + self._refresh_bytes_of(w)
                      for w in range(self.plan.world_size)]
        return {"analytic_bytes": sum(per_worker) / len(per_worker), "analytic_bytes_per_worker": per_worker,
                "analytic_ddp_bytes": analytic_bytes_per_step(self.plan, 0)["ddp"] + clip,
                "virtual_workers": self.plan.world_size}

    def _refresh_bytes_of(self, w: int) -> int:
        return refresh_root_bytes(self.cfg, self.plan, w)

    def summary_rows(self, summary: dict) -> list[tuple[str, str]]:
        rows = [(name, value) for name, value in super().summary_rows(summary) if "(measured)" not in name]
        return [("virtual SDP", self._how()), *rows]

    def _how(self) -> str:
        n = self.plan.world_size
        return (f"{n} workers simulated in one process: memory above is all {n} together, bytes are the plan's "
                "analytic count")

    def step_metrics(self) -> dict:
        return {"sdp_refresh_drift": self.wrapper.last_drift} if self.cfg.sdp.regime == "backward" else {}


def build_virtual_sdp_strategy(cfg, model: nn.Module, ctx, run) -> VirtualSDPStrategy:
    if ctx.group is not None and ctx.world > 1:
        raise RuntimeError("sdp.virtual = true simulates every worker in one process; run it with --parallel.workers 1")
    return VirtualSDPStrategy(cfg, model, ctx, run)
