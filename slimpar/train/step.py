"""One training step, shared by the trainer's loop and the memory prediction (``slimpar plan --memory``).

Algorithm of :meth:`TrainStep.run`, at step ``s``:

1. every optimizer group's learning rate is its base rate times the schedule at ``s`` (warm-up, then cosine);
2. the strategy's ``train_step`` runs forward and backward over ``train.grad_accum`` micro-batches, each this
   data-parallel rank's share of the global batch (:meth:`TrainStep.batch`), then ``after_backward`` (the
   method's communication: SDP's holder sync, a pipeline's shared-parameter sync);
3. the gradients are clipped (``train.grad_clip``) and the guard decides, the same on every rank, whether the
   step may update the weights (it also carries any rank's stop signal);
4. the optimizer steps, or a skipped step drops its gradients; then the strategy's ``after_step``.

:meth:`TrainStep.measured` runs the same step under exact accounting of memory and communication
(``train/memory/measured.py``): the trainer at ``log.measure_step``, the memory prediction under FakeTensorMode.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from slimpar.config import Config
from slimpar.data.shares import batch_share
from slimpar.parallel.comm import StepInstrument
from slimpar.parallel.device import to_device
from slimpar.train.build import lr_at, total_steps
from slimpar.train.job.context import RunContext
from slimpar.train.job.elastic import SampleLog
from slimpar.train.job.preempt import StopRequest
from slimpar.train.memory import accounting as memory
from slimpar.train.memory.measured import measured_step


@dataclass
class TrainStep:
    """A run's step: its config, place, data, strategy, optimizer, guard (anything with ``check``, ``loss``,
    ``gnorm`` and ``skipped``, as :class:`~slimpar.train.guard.StepGuard`), stop request and sample log.

    ``base_lrs`` are the optimizer groups' rates when it is built: build it before a resume overwrites them.
    ``stop`` defaults to an inactive request (no worker's signals: tests, the memory prediction)."""

    cfg: Config
    ctx: RunContext
    data: object
    strategy: object  # slimpar.train.strategies.base.Strategy
    optimizer: torch.optim.Optimizer
    guard: object
    stop: StopRequest = field(default_factory=StopRequest.inactive)
    samples: SampleLog | None = None  # default: one that records nothing (log.samples off)
    base_lrs: list[float] = field(init=False)
    total: int = field(init=False)  # the run's steps: the schedule's length

    def __post_init__(self) -> None:
        self.base_lrs = [g["lr"] for g in self.optimizer.param_groups]
        if self.samples is None:
            self.samples = SampleLog(False, self.ctx.group)
        self.total = total_steps(self.cfg)

    def batch(self, step: int, micro: int):
        """Micro-batch ``micro`` of this data-parallel rank's share of step ``step``'s global batch."""
        cfg, s = self.cfg, self.strategy
        acc = cfg.train.grad_accum
        self.samples.note(step, s.dp_rank, batch_share(step, s.dp_rank * acc + micro, s.dp_world * acc,
                                                       cfg.train.batch_size))
        if cfg.data.kind == "text":
            x, y = self.data.train_batch(step, s.dp_rank * acc + micro, s.dp_world * acc, cfg.train.batch_size,
                                         cfg.data.seq_len)
        else:
            x, y = self.data.train_batch(step, s.dp_rank * acc + micro, s.dp_world * acc, cfg.train.batch_size)
        if getattr(s, "host_batches", False):  # the strategy moves them (a pipeline keeps its token ids on the host)
            return x, y
        return to_device(x, self.ctx.device), to_device(y, self.ctx.device)

    def run(self, step: int, instrument: StepInstrument | None = None,
            saved: memory.SavedActivations | None = None) -> tuple[float, float]:
        """The step (module docstring); returns this rank's loss and the gradient norm (0.0 without clipping)."""
        cfg = self.cfg
        scale = lr_at(step, cfg, self.total) / cfg.train.lr  # warm-up + cosine, per group's base lr
        for g, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            g["lr"] = base * scale
        self.optimizer.zero_grad(set_to_none=True)
        self.samples.step = step
        record = saved.record if saved is not None else contextlib.nullcontext
        loss = self.strategy.train_step(step, self.batch, record)  # device scalars: read once, by the guard
        self.strategy.after_backward()
        gnorm = self.strategy.clip_grad_norm(cfg.train.grad_clip) if cfg.train.grad_clip else 0.0
        finite = self._is_finite(step, loss, gnorm, instrument)
        loss, gnorm = self.guard.loss, self.guard.gnorm if cfg.train.grad_clip else 0.0
        if finite:
            self.optimizer.step()
        else:  # a skipped step (train.skip_bad_steps): no update, and no stale gradient left behind
            self.optimizer.zero_grad(set_to_none=True)
            if self.ctx.is_main:
                print(f"warning: step {step + 1}: non-finite loss or gradient norm, update skipped "
                      f"({len(self.guard.skipped)} of train.skip_bad_steps = {cfg.train.skip_bad_steps})",
                      flush=True)
        self.strategy.after_step()
        return loss, gnorm

    def _is_finite(self, step: int, loss: float, gnorm: float, instrument: StepInstrument | None) -> bool:
        """The guard's verdict, the same on every rank (raises TrainingDiverged past the skip budget).

        Without clipping no norm is computed, so this rank's gradients are checked directly; a pipeline
        stage before the last has no loss of its own (it reports NaN), so only the last stage's counts.
        """
        clipped = bool(self.cfg.train.grad_clip)
        params = () if clipped else self.strategy.parameters()
        signal = self.stop.signum if self.stop.active else 0  # every rank learns of any rank's stop signal here
        return self.guard.check(step, loss, gnorm if clipped else None, params, instrument, signal,
                                self.strategy.loss_on_this_rank)

    def measured(self, step: int) -> tuple[tuple[float, float], dict]:
        """The step under exact accounting of memory and communication: its result and the record a run keeps
        for ``summary.json`` (with the strategy's extra metrics)."""
        result, record = measured_step(lambda inst, saved: self.run(step, inst, saved), self.strategy.model,
                                       self.optimizer, self.ctx.device)
        return result, {**record, **self.strategy.extra_metrics()}
