"""SPEL (spectral descent on the Stiefel manifold) for Stiefel parameter groups, AdamW for the rest.

SPEL, per A ∈ St(d, r) (docs/methods.md, 'SPEL'; Yang & Lai, arXiv 2601.21487):

    G = ∂L/∂A;  M ← βM + (1−β)G                      momentum
    ξ = M − A·sym(AᵀM)                                tangent projection (Euclidean metric)
    D = msign(ξ) = ξ(ξᵀξ)^{-1/2}                     spectral steepest direction, ‖D‖₂ = 1
    A ← msign(A − ηD)                                retraction onto St(d, r) (polar factor)

The retraction's input has every singular value within η (plus a margin) of 1, so it skips Polar Express's
normalisation and table rows: a step count chosen on the host from η alone (one step at η = 1e-3;
slimpar.codecs.stiefel.retract).

η is a spectral step length (a rotation budget per step), not an Adam-like learning rate. msign is
Polar Express (arXiv 2505.16932) in fp32 or the exact small-Gram ``eigh`` polar factor
(slimpar.codecs.stiefel). Unlike some peers (e.g. NVIDIA Emerging-Optimizers' ``Spel``) we keep the
tangent projection (docs/methods.md, 'SPEL').
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.adamw import adamw

from slimpar.codecs.stiefel import (
    BACKENDS,
    DIRECTION_STEPS,
    PolarWork,
    msign,
    orth_error_tensor,
    pinned_fp32,
    retract,
    tangent_project,
)
from slimpar.optim.adamw import adamw_kernels
from slimpar.optim.timing import SpanTimer

# ξ counts as zero when ‖ξ‖_F ≤ TANGENT_RTOL·‖M‖_F: at that level the tangent part is fp32 rounding
# and ‖AᵀA − I‖ noise, and msign would turn the noise into a full-length (‖D‖₂ = 1) step.
TANGENT_RTOL = 1e-6


SPEL_SCHEDULES = ("model", "constant", "cosine")


def spel_lr_at(schedule: str, step: int, base: float, total: int, min_ratio: float, model_lr: float) -> float:
    """η for optimizer step ``step`` (0-based) of ``total``.

    ``model``: ``model_lr``, i.e. whatever the trainer set (spel_lr scaled by the model's warm-up + cosine);
    ``constant``: ``base`` every step; ``cosine``: its own cosine from ``base`` at step 0 to
    ``base * min_ratio``, no warm-up: η_t = f + (base − f)(1 + cos(π t / total)) / 2 with f = base · min_ratio
    (the model's cosine uses the same progress t / total, after its warm-up). η is a rotation budget per
    step (msign gives every direction the same length), so a warm-up meant for Adam's moment estimates
    does not apply to it, and its size is its own (research: η ≈ 1e-3 after a PCA start).
    """
    if schedule == "model":
        return model_lr
    if schedule == "constant":
        return base
    if schedule == "cosine":
        floor = base * min_ratio
        progress = min(step / max(total, 1), 1.0)
        return floor + 0.5 * (base - floor) * (1 + math.cos(math.pi * progress))
    raise ValueError(f"unknown SPEL schedule {schedule!r}; choose from {', '.join(SPEL_SCHEDULES)}")


@torch.no_grad()
def spel_step(
    A: Tensor,
    grad: Tensor,
    momentum_buf: Tensor,
    lr: float,
    beta: float,
    backend: str = "polar_express",
    polar_steps: int = DIRECTION_STEPS,
) -> None:
    """One SPEL update of A (d×r, d ≥ r) in place; ``momentum_buf`` (d×r, fp32) is updated in place.

    M ← βM + (1−β)G;  ξ = M − A sym(AᵀM);  A ← msign(A − η msign(ξ)). If ξ is (near) zero — see
    ``TANGENT_RTOL`` — only the momentum moves. The result is a deterministic function of the
    values of (A, grad, momentum_buf) and the hyperparameters — whatever their memory layouts — so
    ranks sharing A apply bit-identical updates (same torch build, BLAS and thread count assumed).
    Runs at full fp32 matmul precision whatever autocast or TF32 setting the caller has on
    (:func:`~slimpar.codecs.stiefel.pinned_fp32`), and never waits for the device: the near-zero test
    selects on the device (``torch.where``) instead of branching on the host.
    """
    if A.ndim != 2 or A.shape[0] < A.shape[1]:
        raise ValueError(f"SPEL needs A of shape (d, r) with d >= r, got {tuple(A.shape)}")
    with pinned_fp32(A.device.type):
        momentum_buf.mul_(beta).add_(grad.to(momentum_buf.dtype), alpha=1.0 - beta)
        # Contiguous copies: BLAS picks different kernels (and roundings) for different memory layouts,
        # so normalising the layout makes the result a function of the values alone.
        M = momentum_buf.to(torch.float32).contiguous()  # (d, r)
        A32 = A.to(torch.float32).contiguous()  # (d, r)
        xi = tangent_project(A32, M)  # (d, r)
        fro = torch.linalg.matrix_norm(xi, keepdim=True)  # (1, 1) ‖ξ‖_F: the move test and the normalisation
        moves = fro > TANGENT_RTOL * torch.linalg.matrix_norm(M, keepdim=True)  # (1, 1) bool
        work = PolarWork(xi) if backend == "polar_express" else None  # D's and the retraction's iterates
        D = msign(xi, backend=backend, steps=polar_steps, fro=fro, work=work)  # (d, r), singular values ≈ 1
        X = torch.sub(A32, lr * D, out=work.other(D)) if work is not None else A32 - lr * D
        A.copy_(torch.where(moves, retract(X, lr, backend, work=work), A32))


@torch.no_grad()
def spel_steps(As: list[Tensor], grads: list[Tensor], momentum_bufs: list[Tensor], lr: float, beta: float,
               backend: str = "polar_express", polar_steps: int = DIRECTION_STEPS) -> Tensor:
    """:func:`spel_step` on n parameters of one shape (d, r) as one batch (n, d, r): the same update, with the
    batch's matrix products in single batched kernels (the launches of one A for all n; the values those of
    :func:`spel_step` to rounding, not bit for bit). The ``As`` (fp32) and the momentum buffers change in place;
    returns their new values as one (n, d, r) stack.
    """
    with pinned_fp32(As[0].device.type):
        torch._foreach_lerp_(momentum_bufs, [g.to(b.dtype) for g, b in zip(grads, momentum_bufs, strict=True)],
                             1.0 - beta)  # βM + (1 − β)G in one launch
        M = torch.stack(momentum_bufs).to(torch.float32)  # (n, d, r), contiguous
        A32 = torch.stack(As)  # (n, d, r)
        xi = tangent_project(A32, M)  # (n, d, r)
        fro = torch.linalg.matrix_norm(xi, keepdim=True)  # (n, 1, 1) ‖ξ‖_F: the move test and the normalisation
        moves = fro > TANGENT_RTOL * torch.linalg.matrix_norm(M, keepdim=True)  # (n, 1, 1) bool
        work = PolarWork(xi) if backend == "polar_express" else None  # D's and the retraction's iterates
        D = msign(xi, backend=backend, steps=polar_steps, fro=fro, work=work)  # (n, d, r)
        X = torch.add(A32, D, alpha=-lr, out=work.other(D)) if work is not None else torch.add(A32, D, alpha=-lr)
        new = torch.where(moves, retract(X, lr, backend, work=work), A32)
        torch._foreach_copy_(As, list(new.unbind(0)))
    return new


class SPELAdamW(Optimizer):
    """SPEL on parameter groups marked ``{"manifold": "stiefel"}``, AdamW on every other group.

    Stiefel groups read ``lr`` (η, spectral step length), ``momentum`` (β), ``backend``
    ("polar_express" | "eigh"), ``polar_steps`` (Polar Express steps for D; the retraction takes what η needs,
    :func:`~slimpar.codecs.stiefel.retract`) and ``batched`` (default False: True steps the group's parameters
    of one shape as one batch, :func:`spel_steps`: a few dozen launches for all of them instead of a few hundred
    each, equal to the one-by-one update to rounding, not bit for bit; so only where every copy of a shared A is
    in the group, as in the virtual pipeline: ranks holding copies in different batches could part by rounding,
    which the checksums would then repair); ``betas``, ``eps`` and ``weight_decay`` do not
    apply to them (the manifold constraint replaces weight decay). Other groups use ``lr``, ``betas``,
    ``eps``, ``weight_decay`` exactly as ``torch.optim.AdamW`` (decoupled decay, bias correction).

    Purely local: no communication. Where two ranks share a Stiefel parameter they sum its gradient
    first (the caller's job) and then apply the same deterministic update.

    After each ``step()``: ``last_orth_error`` = max over Stiefel parameters of ‖AᵀA − I‖_F, and
    ``last_spel_seconds`` = the time the SPEL updates took: the host's wall time on a CPU, the device's time between
    two events on CUDA (slimpar.optim.timing; the step never waits for the device to measure it, reading the number
    waits for SPEL's last kernel).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        momentum: float = 0.95,
        backend: str = "polar_express",
        polar_steps: int = DIRECTION_STEPS,
    ) -> None:
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            momentum=momentum,
            backend=backend,
            polar_steps=polar_steps,
            manifold=None,
            batched=False,
        )
        self._last_orth: Tensor | None = None
        self.last_spel_timer = SpanTimer.start(None)  # the last step's SPEL span (seconds read when asked for)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group and validate it (Stiefel groups: 2-D parameters with d ≥ r, known backend)."""
        super().add_param_group(param_group)
        _validate_group(self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Apply SPEL to Stiefel groups and AdamW to the others; parameters without a gradient are skipped."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        stiefel = [g for g in self.param_groups if g["manifold"] == "stiefel"]
        for group in self.param_groups:
            if group["manifold"] != "stiefel":
                self._adamw_group(group)
        self.last_spel_timer = self._timed_spel(stiefel)
        return loss

    def _adamw_group(self, group: dict[str, Any]) -> None:
        """torch's own AdamW arithmetic on the whole group at once (fused, or foreach: see
        :func:`~slimpar.optim.adamw.adamw_kernels`; state keys as ``torch.optim.AdamW``'s)."""
        params, grads, avgs, avg_sqs, steps = [], [], [], [], []
        kernels = adamw_kernels([p for p in group["params"] if p.grad is not None])
        fused = kernels.get("fused", False)
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("SPELAdamW does not support sparse gradients")
            state = self.state[p]
            if not state:  # fused kernels keep the step counter on the parameter's device (read by no host)
                state["step"] = torch.tensor(0.0, dtype=torch.float32, device=p.device if fused else None)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(p)
            grads.append(p.grad)
            avgs.append(state["exp_avg"])
            avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if params:
            beta1, beta2 = group["betas"]
            adamw(params, grads, avgs, avg_sqs, [], steps, **kernels, amsgrad=False, beta1=beta1, beta2=beta2,
                  lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)

    def _timed_spel(self, groups: list[dict[str, Any]]) -> SpanTimer:
        stepped = [[p for p in group["params"] if p.grad is not None] for group in groups]
        cuda = next((p.device for ps in stepped for p in ps if p.device.type == "cuda"), None)
        timer = SpanTimer.start(cuda)
        stacks: dict[tuple[int, ...], Tensor] = {}  # a batch's new fp32 A's, stacked, by their ids
        for group, params in zip(groups, stepped, strict=True):
            for batch in _batches(params) if group["batched"] else [[p] for p in params]:
                self._spel(batch, group, stacks)
        self._last_orth = self._orth_error(groups, stacks)
        return timer.stop()

    def _spel(self, params: list[Tensor], group: dict[str, Any], stacks: dict[tuple[int, ...], Tensor]) -> None:
        """SPEL on ``params`` (one of them, or a batch of one shape, device and dtype); a batch's new A's go into
        ``stacks``."""
        As = [self._fp32_copy(p) for p in params]
        bufs = [self.state[p]["momentum"] for p in params]
        args = (group["lr"], group["momentum"], group["backend"], group["polar_steps"])
        if len(params) == 1:
            spel_step(As[0], params[0].grad, bufs[0], *args)
        else:
            stacks[tuple(map(id, As))] = spel_steps(As, [p.grad for p in params], bufs, *args)
        for A, p in zip(As, params, strict=True):
            if A is not p:
                p.copy_(A)

    def _orth_error(self, groups: list[dict[str, Any]], stacks: dict[tuple[int, ...], Tensor]) -> Tensor | None:
        """max ‖AᵀA − I‖_F over every Stiefel parameter, frozen ones too (a frozen A must stay orthogonal as
        well), a batch of one shape at a time in batched groups (from its stack where it was just stepped)."""
        masters = [[self.state[p].get("master", p) for p in g["params"]] for g in groups]
        errors = [orth_error_tensor(_stacked(b, stacks) if len(b) > 1 else b[0])
                  for g, ms in zip(groups, masters, strict=True) for b in (_batches(ms) if g["batched"] else
                                                                            [[m] for m in ms])]
        if len(errors) <= 1:
            return errors[0] if errors else None
        return torch.stack([e.to(errors[0].device) for e in errors]).max()

    def _fp32_copy(self, p: Tensor) -> Tensor:
        """The fp32 A that SPEL steps: ``p`` itself, or for a low-precision ``p`` (bf16 parameters) an fp32
        master copy kept in the state (a bf16 A is orthogonal only to about 1e-2), cast into ``p`` after."""
        state = self.state[p]
        if "momentum" not in state:
            state["momentum"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        if p.dtype == torch.float32:
            return p
        if "master" not in state:
            state["master"] = p.detach().to(torch.float32).clone()
        return state["master"]

    @property
    def last_orth_error(self) -> float:
        """max over the Stiefel parameters stepped last of ‖AᵀA − I‖_F (their fp32 masters where kept); reading
        it waits for the device."""
        return float(self._last_orth) if self._last_orth is not None else 0.0

    @property
    def last_spel_seconds(self) -> float:
        """The last step's SPEL time in seconds (on CUDA, reading it waits for SPEL's last kernel)."""
        return self.last_spel_timer.seconds

    @property
    def last_orth_tensor(self) -> Tensor | None:
        """The same as a 0-d device tensor (None before any SPEL step), without waiting for the device."""
        return self._last_orth


def _stacked(batch: list[Tensor], stacks: dict[tuple[int, ...], Tensor]) -> Tensor:
    """``batch`` as one stack: the one SPEL just made of these tensors' new values, or a new one."""
    found = stacks.get(tuple(map(id, batch)))
    return found if found is not None else torch.stack(batch)


def _batches(params: list[Tensor]) -> list[list[Tensor]]:
    """``params`` grouped by (shape, dtype, device), in first-seen order: what one batched SPEL step can take."""
    out: dict[tuple, list[Tensor]] = {}
    for p in params:
        out.setdefault((tuple(p.shape), p.dtype, p.device), []).append(p)
    return list(out.values())


def _validate_group(group: dict[str, Any]) -> None:
    manifold = group["manifold"]
    if manifold not in (None, "stiefel"):
        raise ValueError(f"unknown manifold {manifold!r}; use 'stiefel' or leave it unset")
    if manifold != "stiefel":
        return
    if group["backend"] not in BACKENDS:
        raise ValueError(f"unknown SPEL backend {group['backend']!r}; choose from {', '.join(BACKENDS)}")
    if not 0.0 <= group["momentum"] < 1.0:
        raise ValueError(f"SPEL momentum must be in [0, 1), got {group['momentum']}")
    if group["polar_steps"] < 1:
        raise ValueError(f"polar_steps must be >= 1, got {group['polar_steps']}")
    for p in group["params"]:
        if p.ndim != 2 or p.shape[0] < p.shape[1]:
            raise ValueError(f"Stiefel parameters must be (d, r) with d >= r, got shape {tuple(p.shape)}")
