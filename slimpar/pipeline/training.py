"""How a compressed pipeline's parameters are stepped: SPEL on MAPL's projector copies, AdamW on the rest.

docs/pipeline.md, "Starting and stepping A". Per step, on every rank that holds stages:
  1. ``start_step``: SPEL's η for the step (``spel_schedule``: ``model`` keeps what the trainer set,
     ``constant`` and ``cosine`` are SPEL's own, optim.spel.spel_lr_at), and from step ``freeze_after``
     on, A frozen: no gradient, so SPEL skips it, and no gradient exchange between the two ends (each
     ``SharedParamSync`` stops sending "projector.A"; both ends freeze at the same step, so their
     exchanges keep matching, and checksums still cover A);
  2. after the schedule and the shared-gradient syncs, ``clip_grad_norm``: one global norm over the
     pipeline, whose ``sum_pipeline`` (the caller's all-reduce over the stages, or identity in one
     process) is the only communication: 1 float64 (``clip`` global or none) or 2 (separate). ``global``
     counts each A's gradient (one copy per boundary: the caller's ``owned`` leaves the receiver's out),
     ``separate`` clips A by its own norm over the pipeline, ``none`` leaves A unclipped (SPEL's step has
     length η anyway);
  3. the optimizer from ``build_optimizer`` steps: SPEL on the Stiefel copies (both ends apply the same
     update to the same summed gradient), AdamW with decay on matrices only on everything else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from slimpar.codec_defaults import CODEC_DEFAULTS
from slimpar.codecs.projector import stiefel_parameters
from slimpar.optim.spel import SPEL_SCHEDULES, SPELAdamW, spel_lr_at
from slimpar.pipeline.sync import SharedParamSync

CLIP_MODES = ("global", "separate", "none")
_SPEL = CODEC_DEFAULTS.spel


@dataclass(frozen=True)
class MaplTrainingSpec:
    """Optimizer settings of a pipeline run (the trainer builds it from its config). SPEL's and A's clip default to
    the CLI's (slimpar.codec_defaults.SPELDefaults), AdamW's to ``[train]``'s."""

    lr: float  # AdamW's base learning rate (the trainer scales every group by its schedule each step)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW's β1, β2
    weight_decay: float = 0.1  # AdamW's decoupled decay, on matrices only (norms and biases get none)
    spel_lr: float = _SPEL.lr  # SPEL's base η, a spectral step length per step
    spel_momentum: float = _SPEL.momentum  # SPEL's momentum β
    polar: str = _SPEL.polar  # msign backend: polar_express | eigh
    spel_schedule: str = _SPEL.schedule  # constant | model | cosine (optim.spel.spel_lr_at)
    total_steps: int = 1  # optimizer steps of the run: the length of SPEL's own cosine
    min_lr_ratio: float = 0.1  # SPEL's cosine ends at spel_lr × this
    freeze_after: int = 0  # A is updated in steps 0..N−1 only; 0 = never frozen
    clip: str = _SPEL.clip  # separate | global | none: how A's gradient enters gradient clipping
    # SPEL steps A's copies of one shape as one batch (optim.spel.spel_steps): fewer launches, the same update to
    # rounding. Only where every copy of each A is stepped here (one process holds the whole pipeline): two ranks
    # batching different sets could part by rounding
    batch_spel: bool = False

    def __post_init__(self) -> None:
        if self.spel_schedule not in SPEL_SCHEDULES:
            raise ValueError(f"unknown SPEL schedule {self.spel_schedule!r}; choose from {', '.join(SPEL_SCHEDULES)}")
        if self.clip not in CLIP_MODES:
            raise ValueError(f"unknown projector clip mode {self.clip!r}; choose from {', '.join(CLIP_MODES)}")


def build_optimizer(module: nn.Module, params: list[nn.Parameter], spec: MaplTrainingSpec) -> SPELAdamW:
    """SPEL on ``module``'s Stiefel projector copies, AdamW on the rest of ``params`` (the trainable ones).

    Groups in this order, empty ones left out: Stiefel, matrices (decay), vectors (no decay).
    """
    stiefel = stiefel_parameters(module)
    skip = {id(p) for p in stiefel}
    rest = [p for p in params if id(p) not in skip]
    groups = [{"params": stiefel, "manifold": "stiefel", "lr": spec.spel_lr, "momentum": spec.spel_momentum,
               "backend": spec.polar, "batched": spec.batch_spel},
              {"params": [p for p in rest if p.dim() >= 2], "weight_decay": spec.weight_decay},
              {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}]
    return SPELAdamW([g for g in groups if g["params"]], lr=spec.lr, betas=spec.betas, eps=1e-8,
                     weight_decay=spec.weight_decay)


def start_step(spec: MaplTrainingSpec, step: int, optimizer: SPELAdamW | None, module: nn.Module,
               syncs: Sequence[SharedParamSync]) -> None:
    """Before step ``step``'s forward (the trainer has just scaled every group by the model's schedule):
    SPEL's η for this step, and A frozen once its steps are done. ``syncs``: the ``SharedParamSync`` ends
    of ``module``'s boundaries."""
    if optimizer is not None:
        for g in optimizer.param_groups:
            if g["manifold"] == "stiefel":
                g["lr"] = spel_lr_at(spec.spel_schedule, step, spec.spel_lr, spec.total_steps, spec.min_lr_ratio,
                                     g["lr"])
    if spec.freeze_after and step >= spec.freeze_after:
        freeze_projectors(module, syncs)


def freeze_projectors(module: nn.Module, syncs: Sequence[SharedParamSync]) -> None:
    """A keeps its value: no gradient (so SPEL skips it) and no gradient exchange (fewer sync bytes)."""
    for A in stiefel_parameters(module):
        A.requires_grad_(False)
        A.grad = None
    for sync in syncs:
        sync.freeze("projector.A")


def clip_grad_norm(spec: MaplTrainingSpec, module: nn.Module, params: list[nn.Parameter],
                   owned: list[nn.Parameter], max_norm: float, sum_pipeline: Callable[[Tensor], Tensor],
                   device: torch.device) -> Tensor:
    """Clip ``params``' gradients by the norm over all stages of one pipeline; returns that norm (a float64
    scalar on ``device``, the run's, where the gradients are: the factors are applied there, so clipping never
    waits for the device).

    ``owned``: the parameters this rank counts in the norm (each shared or tied weight once over the
    pipeline); ``sum_pipeline`` sums a float64 tensor over the stages. The same factor is applied on every
    stage. ``spec.clip`` decides A's part (module docstring).
    """
    clip = spec.clip
    proj = set() if clip == "global" else {id(p) for p in stiefel_parameters(module)}
    counted = [[p for p in owned if id(p) not in proj]]  # the model's part, then A's own where clipped apart
    scaled = [[p for p in params if id(p) not in proj]]
    if clip == "separate":
        counted.append([p for p in owned if id(p) in proj])
        scaled.append([p for p in params if id(p) in proj])
    norms = sum_pipeline(_sq_norms(counted, device)).sqrt()  # one all-reduce of 1 or 2 numbers
    coefs = (max_norm / (norms + 1e-6)).clamp(max=1.0)  # min(1, ·): a factor of 1 leaves the bits as they are
    for part, coef in zip(scaled, coefs.unbind(0), strict=True):
        grads = [p.grad for p in part if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, coef.to(grads[0].device))
    return norms[0]


def _sq_norms(parts: list[list[nn.Parameter]], device: torch.device) -> Tensor:
    """Σ ‖grad‖² of each part's parameters as float64, one number a part, on ``device``: every gradient's norm in
    one launch, then each part's sum (a part's sum is the same whatever the other parts hold).

    The zeros of empty parts are made on ``device``, not on a device read from ``params``: a part is empty
    whenever a rank holds no projector of its own (codecs without one, MAPL's last stage, whose A is the
    receiver's copy), and a zero made on the CPU beside device scalars fails ``torch.stack`` on a GPU.
    """
    grads = [[p.grad for p in part if p.grad is not None] for part in parts]
    flat = [g for part in grads for g in part]
    if not flat:
        return torch.zeros(len(parts), dtype=torch.float64, device=device)
    sq = torch.stack(torch._foreach_norm(flat)).double().pow(2)  # (all,)
    if len(parts) == 1:
        return sq.sum().unsqueeze(0)
    return torch.stack([s.sum() for s in sq.split([len(part) for part in grads])])
