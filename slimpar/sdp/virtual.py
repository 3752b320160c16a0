"""SDP simulated in one process: N workers' subnetworks side by side, no process group.

``VirtualSDP`` builds worker w's subnetwork with :func:`~slimpar.sdp.apply.apply_subnet` on its own
copy of the full model, exactly as ``SubnetworkDataParallel`` does on rank w, and replaces every
collective of the real run by the same arithmetic in this process (METHODS.md Part 1):

1. ``sync()`` (after every worker's backward): each component's gradient is averaged over exactly
   its holders, ĝ_c = (1/k_c) Σ_{i∈S_c} g_{i,c}; shared parameters over all N workers; a component
   held by one worker is left alone; a holder with no gradient counts zeros. The gradients go into
   the same buckets as in sync.py, are summed in float32 in the order gloo's ring all-reduce adds
   them (:func:`ring_sum`), then divided by k_c: on CPU the result is bit-identical to the
   multi-process gloo run (NCCL on GPU adds in its own order: equal to rounding).
2. ``clip_grad_norm_``: the norm of the full averaged gradient, each component counted once (at its
   first holder, shared parameters at worker 0, the float64 partial sums added over workers), and
   every worker scaled by the same factor — ``SubnetworkDataParallel.clip_grad_norm_``.
3. ``refresh()`` (backward regime, after the optimizer step): non-holders copy each component from its
   first holder, every ``refresh_every`` steps; ``last_drift`` is the largest change a copy made.
4. ``gather_full_model()``: the full model, every tensor taken from the worker the real gather
   broadcasts it from (gather.py); ``check_replicas()`` compares holders' copies bit for bit.

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

from slimpar.sdp.apply import Subnet, apply_subnet
from slimpar.sdp.components import model_components
from slimpar.sdp.gather import _fill, _owner_of, materialize, meta_skeleton
from slimpar.sdp.plan import Plan
from slimpar.sdp.sync import Piece
from slimpar.sdp.wrapper import _groups_of, refresh_sets


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
            checkpointing); it must keep the parameter objects.
    """

    def __init__(self, model: nn.Module, plan: Plan, regime: str = "forward", refresh_every: int = 1,
                 shared_names: list[str] | None = None, device: torch.device | str | None = None,
                 parallelize=None, bucket_mb: float = 25.0):
        if regime not in ("forward", "backward"):
            raise ValueError(f"unknown SDP regime {regime!r}; choose 'forward' or 'backward'")
        self.plan, self.regime, self.refresh_every = plan, regime, refresh_every
        if shared_names is None and plan.shared_params:
            shared_names = list(plan.shared_params)
        if shared_names is None:
            level = "neuron" if any(c.index is not None for c in plan.components) else "block"
            _, shared_names, _ = model_components(model, level, _groups_of(plan))
        self.skeleton = meta_skeleton(model)
        if device is not None:
            model.to(device)
        n = plan.world_size
        self.modules: list[nn.Module] = [model] + [copy.deepcopy(model) for _ in range(n - 1)]
        self.subs: list[Subnet] = [apply_subnet(m, plan, w, shared_names, regime) for w, m in enumerate(self.modules)]
        if parallelize is not None:
            for m in self.modules:
                parallelize(m)
        self.refresh_sets = refresh_sets(plan) if regime == "backward" else {}
        self.steps = 0
        self.last_drift = 0.0
        self.cap_bytes = int(bucket_mb * 2**20)
        self.grad_sync = None  # nothing is communicated (the strategy's metrics read this)

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    def _groups(self) -> list[tuple[str, tuple[int, ...], list[list[Piece]]]]:
        """(name, holders, [each holder's pieces]) per component with k > 1, then the shared parameters."""
        out = []
        for c, comp in enumerate(self.plan.components):
            holders = self.plan.holders(c)
            if len(holders) > 1:
                out.append((comp.name, holders, [self.subs[w].pieces[c] for w in holders]))
        everyone = tuple(range(self.world_size))
        if self.world_size > 1:
            out.append(("shared parameters", everyone, [self.subs[w].shared for w in everyone]))
        return out

    # ------------------------------------------------------------ gradient sync
    def _buckets(self, cap_bytes: int) -> list[tuple[tuple[int, ...], list[list[Piece]]]]:
        """The real run's all-reduce buckets: (holders, [each holder's pieces]) per bucket, the pieces of
        a holder set in ``SubnetworkDataParallel._build_sync``'s order, split by ``make_buckets``' rule."""
        out = []
        by_set: dict[tuple[int, ...], list[list[Piece]]] = {}
        for sub in self.subs:  # worker order = rank order in every holder group
            mine: dict[tuple[int, ...], list[Piece]] = {}
            for c in sorted(sub.pieces, reverse=True):
                mine.setdefault(self.plan.holders(c), []).extend(sub.pieces[c])
            mine.setdefault(tuple(range(self.world_size)), []).extend(reversed(sub.shared))
            for key, pieces in mine.items():
                by_set.setdefault(key, []).append(pieces)
        for key in sorted(by_set):
            if len(key) < 2:
                continue
            lists, start, nbytes = by_set[key], 0, 0
            for j, piece in enumerate(lists[0]):
                nbytes += piece.numel * piece.param.element_size()
                if nbytes >= cap_bytes or j == len(lists[0]) - 1:
                    out.append((key, [pcs[start:j + 1] for pcs in lists]))
                    start, nbytes = j + 1, 0
        return out

    @torch.no_grad()
    def sync(self) -> None:
        """Average every component's gradient over its holders, shared parameters over all workers."""
        for holders, pieces in self._buckets(self.cap_bytes):
            flats = [torch.cat([_grad_view(p).reshape(-1) for p in pcs]) for pcs in pieces]
            total = ring_sum(flats).div_(len(holders))
            for pcs in pieces:
                offset = 0
                for p in pcs:
                    g = _grad_view(p)
                    g.copy_(total[offset:offset + g.numel()].view(g.shape))
                    offset += g.numel()

    # -------------------------------------------------------------- clipping
    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip every worker by the norm of the full model's averaged gradient; returns that norm."""
        total = torch.zeros((), dtype=torch.float64)
        for w, sub in enumerate(self.subs):
            sq = torch.zeros((), dtype=torch.float64)
            for c, pieces in sub.pieces.items():
                if self.plan.holders(c)[0] == w:
                    sq += sum(_sq(p) for p in pieces)
            if w == 0:
                sq += sum(_sq(p) for p in sub.shared)
            total += sq
        norm = float(total.sqrt())
        if max_norm > 0 and norm > max_norm:
            scale = max_norm / (norm + 1e-6)
            for m in self.modules:
                for p in m.parameters():
                    if p.grad is not None:
                        p.grad.mul_(scale)
        return norm

    # ---------------------------------------------------- backward-regime refresh
    @torch.no_grad()
    def refresh(self) -> None:
        """Backward regime: every worker that does not hold a component copies it from its first holder."""
        self.steps += 1
        if self.regime != "backward" or self.steps % self.refresh_every:
            return
        drift = 0.0
        for c, members in self.refresh_sets.items():
            src = self.subs[self.plan.holders(c)[0]].views[c]
            for w in members:
                if self.plan.mask[w, c]:
                    continue
                for dst, s in zip(self.subs[w].views[c], src, strict=True):
                    drift = max(drift, float((s - dst).abs().max())) if dst.numel() else drift
                    dst.copy_(s)
        self.last_drift = drift

    # -------------------------------------------------------- replica checks
    @torch.no_grad()
    def check_replicas(self) -> None:
        """Raise, naming the component, unless all holders' copies are bit-identical."""
        for name, holders, pieces in self._groups():
            for other in pieces[1:]:
                for a, b in zip(pieces[0], other, strict=True):
                    if not torch.equal(a.view(a.param.detach()), b.view(b.param.detach())):
                        raise RuntimeError(f"SDP replicas of {name} differ across holders {list(holders)}")

    # --------------------------------------------------------------- gather
    def local_full_tensors(self, w: int) -> dict[str, torch.Tensor]:
        """Worker w's parameters and buffers by full-model name (split tensors rebuilt whole)."""
        m = self.modules[w]
        tensors = dict(m.named_parameters()) | dict(m.named_buffers())
        for name, (module, attr, dim) in self.subs[w].split.items():
            tensors[name] = torch.cat([getattr(module, attr + "_held"), getattr(module, attr + "_frozen")], dim)
        return tensors

    @torch.no_grad()
    def gather_full_model(self, device: torch.device | str = "cpu", rescale: str = "none") -> nn.Module:
        """The full model, each tensor from the worker the distributed gather takes it from."""
        full = materialize(self.skeleton, torch.device(device))
        mine = [self.local_full_tensors(w) for w in range(self.world_size)]
        owners = _owner_of(self.plan)
        block_src = {k[len("__module__"):]: v[0][0] for k, v in owners.items() if k.startswith("__module__")}
        for name, target in list(full.named_parameters()) + list(full.named_buffers()):
            if name in owners:
                sources = owners[name]
            else:
                src = next((s for prefix, s in block_src.items() if name.startswith(prefix + ".")), 0)
                sources = [(src, None, 0)]
            for src, index, dim in sources:
                _fill(target, mine[src].get(name), src, index, dim, self.subs[src], name, src, None, None)
        if rescale == "survival":
            for c, comp in enumerate(self.plan.components):
                if comp.index is None:
                    full.get_submodule(comp.name).residual_scale = len(self.plan.holders(c)) / self.world_size
        return full


def ring_sum(flats: list[torch.Tensor]) -> torch.Tensor:
    """Σ of k equal-length flat tensors, added in the order gloo's ring all-reduce adds them (gloo's
    ``allreduce.cc``, checked bit for bit against gloo for k = 3 and 4 up to 3M float32 elements): the buffer
    is cut into 2k segments of ceil(L / 2k) elements; segment s belongs to chunk c = s // 2, whose partial sum
    starts at group rank c - 1 and picks up ranks c - 2, c - 3, ... (mod k) as it travels the ring."""
    k, n = len(flats), flats[0].numel()
    if k == 1:
        return flats[0].clone()
    seg = -(-n // (2 * k))
    out = torch.empty_like(flats[0])
    for s in range(2 * k):
        lo, hi = s * seg, min(n, (s + 1) * seg)
        if lo >= hi:
            continue
        c = s // 2
        acc = flats[(c - 1) % k][lo:hi].clone()
        for j in range(2, k + 1):
            acc += flats[(c - j) % k][lo:hi]
        out[lo:hi] = acc
    return out


def _grad_view(p: Piece) -> torch.Tensor:
    """The piece's slice of its parameter's gradient (a zero gradient is created where there is none)."""
    if p.param.grad is None:
        p.param.grad = torch.zeros_like(p.param)
    return p.view(p.param.grad)


def _sq(p: Piece) -> torch.Tensor:
    if p.param.grad is None:
        return torch.zeros((), dtype=torch.float64)
    return p.view(p.param.grad).double().pow(2).sum()
