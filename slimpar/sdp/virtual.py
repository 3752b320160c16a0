"""SDP simulated in one process: N workers' subnetworks side by side, no process group.

``VirtualSDP`` builds worker w's subnetwork with :func:`~slimpar.sdp.apply.apply_subnet` on its own
copy of the full model, exactly as ``SubnetworkDataParallel`` does on rank w, and runs the very same
synchronisation code, :class:`~slimpar.sdp.holders.HolderSync`, with every worker in this process: its
collectives are :class:`~slimpar.sdp.comm.LocalComm`'s arithmetic, which adds in the order gloo's ring
all-reduce adds, so on CPU the result is bit-identical to the multi-process gloo run (NCCL on GPU adds in
its own order: equal to rounding). The phases are those of the real run (docs/methods.md, 'Holder averaging'):
holder-set averaging in the real run's buckets (``sync()``, after every worker's backward), the global clip norm,
the backward regime's refresh, replica checks and the full-model gather.

Each worker keeps its own optimizer over ``modules[w]``'s trainable parameters (or one optimizer over
all of them: AdamW is elementwise, so it is the same arithmetic). Bytes are not sent, so none are
measured: the plan's analytic count (:func:`~slimpar.sdp.plan.analytic_bytes_per_step`) is the
figure; memory is that of all N workers in one process.

    v = VirtualSDP(model, plan, regime="forward")
    opts = [torch.optim.AdamW(m.parameters()) for m in v.modules]
    for step in range(steps):
        for w, m in enumerate(v.modules):
            loss_fn(m(x[w]), y[w]).backward()
        v.sync(); v.clip_grad_norm_(1.0)
        for o in opts: o.step(); o.zero_grad()
        v.refresh()
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from slimpar.sdp.apply import Subnet, apply_subnet, shared_names_of
from slimpar.sdp.comm import LocalComm, ring_sum
from slimpar.sdp.holders import HolderSync
from slimpar.sdp.plan import Plan

__all__ = ["VirtualSDP", "ring_sum"]


class VirtualSDP:
    """All ``plan.world_size`` workers of an SDP run in this process (see the module docstring).

    Args:
        model: the full model (it becomes worker 0's subnetwork; the others are deep copies of it).
        plan: the mask plan; worker w = row w.
        regime: "forward" or "backward", as for ``SubnetworkDataParallel``.
        refresh_every: backward regime: refresh non-held copies every T steps.
        shared_names: parameters every worker holds (default: the plan's, else from the model).
        device: where the workers' models live (moved before the subnetworks are cut, so the backward
            regime's views stay views of the tensors the models use).
        parallelize: applied to every worker's module after its subnetwork is cut (e.g. activation
            checkpointing), before the sync binds to its parameters.
    """

    def __init__(self, model: nn.Module, plan: Plan, regime: str = "forward", refresh_every: int = 1,
                 shared_names: list[str] | None = None, device: torch.device | str | None = None,
                 parallelize=None, bucket_mb: float = 25.0):
        if regime not in ("forward", "backward"):
            raise ValueError(f"unknown SDP regime {regime!r}; choose 'forward' or 'backward'")
        self.plan, self.regime = plan, regime
        shared_names = shared_names or shared_names_of(model, plan)
        if device is not None:
            model.to(device)
        n = plan.world_size
        self.modules: list[nn.Module] = [model] + [copy.deepcopy(model) for _ in range(n - 1)]
        self.subs: list[Subnet] = [apply_subnet(m, plan, w, shared_names, regime) for w, m in enumerate(self.modules)]
        self.skeleton = self.subs[0].skeleton
        if parallelize is not None:
            for m in self.modules:
                parallelize(m)
        workers = {w: (m, sub) for w, (m, sub) in enumerate(zip(self.modules, self.subs, strict=True))}
        self.holders = HolderSync(workers, plan, LocalComm(n), regime, bucket_mb, overlap=False,
                                  refresh_every=refresh_every)
        self.grad_sync = None  # nothing is communicated (the strategy's metrics read this)

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def last_drift(self) -> float:
        return self.holders.last_drift

    def sync(self) -> None:
        """Average every component's gradient over its holders, shared parameters over all workers."""
        self.holders.sync()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip every worker by the norm of the full model's averaged gradient; returns that norm."""
        return self.holders.clip_grad_norm_(max_norm)

    def refresh(self) -> None:
        """Backward regime: every worker that does not hold a component gets it from its refresh root."""
        self.holders.refresh()

    def check_replicas(self) -> None:
        """Raise, naming the component, unless all holders' copies are bit-identical."""
        self.holders.check_replicas()

    def local_full_tensors(self, w: int) -> dict[str, torch.Tensor]:
        """Worker w's parameters and buffers by full-model name (split tensors rebuilt whole)."""
        return self.holders.local_full_tensors(w)

    @torch.no_grad()
    def gather_full_model(self, device: torch.device | str | None = None, rescale: str = "none") -> nn.Module:
        """The full model (on the workers' device unless ``device`` says), each tensor from the worker the
        distributed gather takes it from."""
        return self.holders.gather_full_model(self.skeleton, device, rescale)
