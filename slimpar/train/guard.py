"""Guarded training: a step whose loss or gradient norm is NaN or inf is skipped or stops the run.

A diverged run must not go on training on garbage and export it with exit code 0. Every rank must
take the same decision (a rank that skips the optimizer step while another applies it leaves the
replicas apart and the next collective mismatched), so the local verdicts are summed with one small
all-reduce over the run's group before the optimizer step, of a float64 vector on the group's device
(NCCL reduces CUDA tensors only: slimpar.parallel.device). The same vector carries, summed: the ranks'
losses and how many ranks have one (the logged mean loss, without a collective of its own) and which stop
signal each rank received (one count per signal of ``stop_signals``: every rank stops after the same step,
slimpar.train.job.preempt). One read of the reduced vector, with this rank's loss and norm beside it, is
the step's one host sync: the loss, the norm and the finiteness checks stay on the device until then.
That collective is kept out of the measured step's byte accounting: it is the guard's, not the method's.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable

import torch
import torch.distributed as dist

from slimpar.parallel.device import group_device

ADVICE = ("the learning rate is likely too high: lower --train.lr (or raise --train.warmup_steps, or clip with "
          "--train.grad_clip 1.0); to ride over rare spikes, skip a few bad steps with --train.skip_bad_steps N")


class TrainingDiverged(RuntimeError):
    """The loss, the gradient norm or the exported weights are not finite (the CLI exits non-zero)."""


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (checking it needs no collective); plain tensors as they are."""
    return t.to_local() if hasattr(t, "to_local") else t


def grads_finite(params: Iterable[torch.nn.Parameter], device: torch.device) -> torch.Tensor:
    """Whether this rank's gradients are all finite, as a bool on ``device`` (used when no gradient norm is
    computed, grad_clip 0): one reduction per gradient, no read. Without gradients: True, made on ``device``."""
    checks = [torch.isfinite(_local(p.grad)).all() for p in params if p.grad is not None]
    return torch.stack(checks).all().to(device) if checks else torch.ones((), dtype=torch.bool, device=device)


def _paused(instrument: object | None):
    """Hide the guard's own tensors and collective from a StepInstrument (a TorchDispatchMode)."""
    if instrument is None:
        return contextlib.nullcontext()
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


class StepGuard:
    """Decides, identically on every rank, whether a step may update the weights.

    ``check`` returns True for a good step and False for a bad one within the ``skip_budget``; past the
    budget it raises :class:`TrainingDiverged` naming the step, the values and the likely cause. After it,
    ``loss`` and ``gnorm`` hold this rank's values, ``mean_loss`` the mean over the ranks that have a loss and
    ``signal`` the stop signal any rank received (0: none).
    """

    def __init__(self, skip_budget: int, group: dist.ProcessGroup | None, lr: float, rank: int = 0,
                 stop_signals: tuple[int, ...] = ()):
        self.skip_budget = skip_budget
        self.group = group
        self.lr = lr
        self.rank = rank
        self.stop_signals = tuple(int(s) for s in stop_signals)
        self.skipped: list[int] = []  # steps (1-based) whose update was dropped
        self.loss = self.gnorm = self.mean_loss = math.nan
        self.signal = 0

    def check(self, step: int, loss, gnorm, params: Iterable[torch.nn.Parameter] = (),
              instrument: object | None = None, signal: int = 0, has_loss: bool = True) -> bool:
        """``loss`` and ``gnorm``: floats or device scalars (read here, once); ``gnorm`` None means no norm was
        computed: then ``params``' gradients are checked on this rank. ``signal``: the stop signal this rank
        received (0: none); ``has_loss`` False for a pipeline stage without a loss of its own."""
        with _paused(instrument):
            device = group_device(self.group) if self.group is not None else _device_of(loss, gnorm)
            mine = _values(loss if has_loss else 0.0, gnorm, params, device)  # [loss, norm, finite] float64
            counts = torch.zeros(1 + len(self.stop_signals), dtype=torch.float64, device=device)  # no host copy
            counts[0] = float(has_loss)
            if signal in self.stop_signals:
                counts[1 + self.stop_signals.index(signal)] = 1.0
            shared = torch.cat([(mine[2] == 0).reshape(1).double(), (mine[0] * has_loss).reshape(1), counts])
            if self.group is not None:
                dist.all_reduce(shared, group=self.group)
            read = torch.cat([shared, mine]).tolist()  # the step's one wait for the device
        bad_ranks, loss_sum, ranks_with_loss, *signals = read[:3 + len(self.stop_signals)]
        self.loss, self.gnorm, finite = read[-3], read[-2], bool(read[-1])
        self.mean_loss = loss_sum / ranks_with_loss if ranks_with_loss else math.nan
        self.signal = next((s for s, n in zip(self.stop_signals, signals, strict=True) if n), 0)
        if not bad_ranks:
            return True
        done = step + 1
        what = _describe(self.loss if has_loss else 0.0, self.gnorm if gnorm is not None else None, finite,
                         int(bad_ranks), self.rank, self.group is not None)
        if len(self.skipped) < self.skip_budget:
            self.skipped.append(done)
            return False
        spent = f" after skipping {len(self.skipped)} bad step(s) {self.skipped}" if self.skipped else ""
        raise TrainingDiverged(f"training diverged at step {done}{spent}: {what} (train.lr = {self.lr:g}); "
                               f"{ADVICE}")


def _device_of(*values) -> torch.device:
    return next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))


def _values(loss, gnorm, params, device: torch.device) -> torch.Tensor:
    """[loss, norm (0 without one), 1 if both and this rank's unchecked gradients are finite] on ``device``."""
    def as_t(v) -> torch.Tensor:  # a Python number becomes a fill on the device, not a copy from the host
        if isinstance(v, torch.Tensor):
            return v.detach().to(device, torch.float64).reshape(())
        return torch.full((), float(v), dtype=torch.float64, device=device)

    norm = as_t(gnorm if gnorm is not None else 0.0)
    finite = torch.isfinite(as_t(loss)) & torch.isfinite(norm)
    if gnorm is None:
        finite = finite & grads_finite(params, device)
    return torch.stack([as_t(loss), norm, finite.double()])


def _describe(loss: float, gnorm: float | None, grads_ok: bool, bad_ranks: int, rank: int, distributed: bool) -> str:
    values = [f"loss {loss:g}"] + ([f"gradient norm {gnorm:g}"] if gnorm is not None else [])
    if not grads_ok:
        values.append("non-finite gradients")
    if not distributed:
        return "non-finite loss or gradient (" + ", ".join(values) + ")"
    return (f"non-finite loss or gradient on {bad_ranks} rank(s) (rank {rank} has " + ", ".join(values) + ")")


def check_export(state: dict[str, torch.Tensor]) -> None:
    """Refuse to export weights holding NaN or inf: a silently broken model file is worse than none."""
    bad = {name: int((~torch.isfinite(t)).sum()) for name, t in state.items()
           if t.is_floating_point() and not bool(torch.isfinite(t).all())}
    if bad:
        names = ", ".join(f"{n} ({c:,})" for n, c in list(bad.items())[:5])
        raise TrainingDiverged(f"refusing to export model.safetensors: {sum(bad.values()):,} non-finite weights in "
                               f"{len(bad)} tensor(s), e.g. {names}; {ADVICE}")
