"""Guarded training: a step whose loss or gradient norm is NaN or inf is skipped or stops the run.

A diverged run must not go on training on garbage and export it with exit code 0. Every rank must
take the same decision (a rank that skips the optimizer step while another applies it leaves the
replicas apart and the next collective mismatched), so the local verdicts are OR-ed with one 8-byte
all-reduce over the run's group before the optimizer step, of a tensor on the group's device (NCCL
reduces CUDA tensors only: slimpar.parallel.device). That collective is kept out of the measured step's
byte accounting: it is the guard's, not the method's.
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


def grads_finite(params: Iterable[torch.nn.Parameter]) -> bool:
    """Whether this rank's gradients are all finite: used when no gradient norm is computed (grad_clip 0)."""
    return all(bool(torch.isfinite(_local(p.grad)).all()) for p in params if p.grad is not None)


def _paused(instrument: object | None):
    """Hide the guard's own tensors and collective from a StepInstrument (a TorchDispatchMode)."""
    if instrument is None:
        return contextlib.nullcontext()
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


class StepGuard:
    """Decides, identically on every rank, whether a step may update the weights.

    ``check`` returns True for a good step and False for a bad one within the ``skip_budget``; past the
    budget it raises :class:`TrainingDiverged` naming the step, the values and the likely cause.
    """

    def __init__(self, skip_budget: int, group: dist.ProcessGroup | None, lr: float, rank: int = 0):
        self.skip_budget = skip_budget
        self.group = group
        self.lr = lr
        self.rank = rank
        self.skipped: list[int] = []  # steps (1-based) whose update was dropped

    def check(self, step: int, loss: float, gnorm: float | None, params: Iterable[torch.nn.Parameter] = (),
              instrument: object | None = None) -> bool:
        """``gnorm`` None means no norm was computed: then ``params``' gradients are checked on this rank."""
        with _paused(instrument):
            local_grads_ok = grads_finite(params)
            ok = math.isfinite(loss) and (gnorm is None or math.isfinite(gnorm)) and local_grads_ok
            bad_ranks = self._agree(not ok)
        if not bad_ranks:
            return True
        done = step + 1
        what = _describe(loss, gnorm, local_grads_ok, bad_ranks, self.rank, self.group is not None)
        if len(self.skipped) < self.skip_budget:
            self.skipped.append(done)
            return False
        spent = f" after skipping {len(self.skipped)} bad step(s) {self.skipped}" if self.skipped else ""
        raise TrainingDiverged(f"training diverged at step {done}{spent}: {what} (train.lr = {self.lr:g}); "
                               f"{ADVICE}")

    def _agree(self, bad: bool) -> int:
        """How many ranks saw a non-finite value (the same number on every rank)."""
        if self.group is None:
            return int(bad)
        t = torch.tensor([float(bad)], dtype=torch.float64, device=group_device(self.group))
        dist.all_reduce(t, group=self.group)
        return int(t.item())


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
