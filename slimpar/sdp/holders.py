"""``HolderSync``: everything SDP communicates, for the workers that live in this process.

One object owns SDP's synchronisation (docs/methods.md, 'Holder averaging') for a real run (one worker per process, any
parent group: :class:`~slimpar.sdp.comm.GroupComm`) and for ``VirtualSDP`` (every worker in one process:
:class:`~slimpar.sdp.comm.LocalComm`). It is built *after* the subnetwork is cut (:func:`apply_subnet`)
and after any activation checkpointing or FSDP2 was applied from outside: its pieces are bound by name to
the module's parameters as they are then. Communication phases:

1. every step, during backward: each component's gradient is averaged over its holders S_c only,
   ĝ_c = (1/k_c) Σ_{i∈S_c} g_{i,c}, shared parameters over all workers, bucketed by holder set and
   overlapped with backward (:class:`~slimpar.sdp.sync.GradSync`); ``sync()`` finishes it;
2. ``clip_grad_norm_``: one float64 all-reduce over the parent group gives the norm of the full averaged
   gradient (each component counted at its first holder, shared parameters at worker 0), so every holder
   clips by the same factor; each worker's share is one scalar on its gradients' device (NCCL reduces CUDA
   tensors only), and reading the norm is the step's one host sync here;
3. backward regime, after the optimizer step: each component some worker lacks is broadcast from its
   refresh root (:mod:`slimpar.sdp.roots`) to the workers that do not hold it, every ``refresh_every`` steps;
4. ``check_replicas()``: the holders of each set all-gather one fingerprint per component (on the
   device) and compare;
5. ``gather_full_model()``: every tensor of the full model broadcast from one holder to every rank, or sent
   point to point to one rank only (``dst``: evaluation, where a rank may fit its subnetwork but not the
   full model as well) (:mod:`slimpar.sdp.gather`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from functools import partial

import torch
from torch import nn

from slimpar.parallel.fingerprint import fingerprint
from slimpar.sdp.apply import Subnet
from slimpar.sdp.gather import gather_full_model
from slimpar.sdp.plan import Plan
from slimpar.sdp.roots import refresh_members, refresh_roots
from slimpar.sdp.sync import GradSync, Piece, local, make_buckets


def refresh_sets(plan: Plan) -> dict[int, tuple[int, ...]]:
    """Backward regime: component -> workers in its refresh broadcast (its root, the only holder among them,
    + non-holders), in plan order; components every worker holds are never stale and are left out."""
    return {c: refresh_members(plan, c, root) for c, root in refresh_roots(plan).items()}


def holder_sets(plan: Plan, regime: str, refresh: dict[int, tuple[int, ...]] | None = None) -> list[tuple[int, ...]]:
    """Every set of workers that communicates: the holder sets, and the backward regime's refresh sets
    (``refresh``: those :func:`refresh_sets` gave, when the caller has them already)."""
    if regime != "backward":
        return list(plan.distinct_holder_sets)
    return list(plan.distinct_holder_sets) + list((refresh_sets(plan) if refresh is None else refresh).values())


class ReplicaMismatch(RuntimeError):
    """The holders of a component (or of the shared parameters) hold different values after a step."""


class HolderSync:
    """SDP's synchronisation of ``workers`` (worker index -> (its module, its Subnet)) over ``comm``.

    Args:
        accumulations: M > 1 when gradients accumulate over M backward passes that the caller does not
            divide (a pipeline schedule built with ``scale_grads=False``): each is final after M passes and
            enters its bucket divided by M.
        fsdp_does_averaging: holder-sharded FSDP2 (:mod:`slimpar.sdp.holder_fsdp`) averages in its own
            reduce-scatter: no gradient sync here, and every element lives on exactly one shard.
        reduce_dtype: dtype of the holder sums (default fp32, whatever the parameters' dtype; None: theirs).
        refresh: the backward regime's :func:`refresh_sets`, when the caller computed them (for its groups).
    """

    def __init__(self, workers: dict[int, tuple[nn.Module, Subnet]], plan: Plan, comm, regime: str = "forward",
                 bucket_mb: float = 25.0, overlap: bool = True, refresh_every: int = 1,
                 fsdp_does_averaging: bool = False, accumulations: int = 1,
                 reduce_dtype: torch.dtype | None = torch.float32,
                 refresh: dict[int, tuple[int, ...]] | None = None):
        self.plan, self.comm, self.regime, self.refresh_every = plan, comm, regime, refresh_every
        self.modules = {w: m for w, (m, _) in workers.items()}
        self.subs = {w: sub for w, (_, sub) in workers.items()}
        for w, sub in self.subs.items():
            _bind(sub, self.modules[w])
        self.fsdp_does_averaging = fsdp_does_averaging
        if regime != "backward":
            refresh = {}
        self.refresh_sets = refresh_sets(plan) if refresh is None else refresh
        self.steps, self._drift = 0, None
        self.everyone = tuple(range(plan.world_size))
        self.grad_sync: GradSync | None = None
        if not fsdp_does_averaging and plan.world_size > 1:
            by_worker = {w: self._pieces_by_set(sub) for w, sub in self.subs.items()}
            self.grad_sync = GradSync(make_buckets(by_worker, int(bucket_mb * 2**20)), comm, overlap=overlap,
                                      accumulations=accumulations, divide_by=accumulations,
                                      reduce_dtype=reduce_dtype)

    @property
    def device(self) -> torch.device:
        """Where the workers' parameters are (read each time: a caller may move the module after wrapping it)."""
        return _device(self.modules.values())

    def _pieces_by_set(self, sub: Subnet) -> dict[tuple[int, ...], list[Piece]]:
        """A worker's pieces by holder set, in the canonical order every holder shares (backward visits late
        components first; shared parameters last)."""
        by_set: dict[tuple[int, ...], list[Piece]] = {}
        for c in sorted(sub.pieces, reverse=True):
            by_set.setdefault(self.plan.holders(c), []).extend(sub.pieces[c])
        by_set.setdefault(self.everyone, []).extend(reversed(sub.shared))
        return by_set

    # ------------------------------------------------------------ gradient sync
    def sync(self) -> None:
        """Finish holder-set averaging (after backward, before the optimizer step)."""
        if self.grad_sync is not None:
            self.grad_sync.finish()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (gradient accumulation); the next synced backward averages."""
        if self.grad_sync is None:
            yield
            return
        self.grad_sync.enabled = False
        try:
            yield
        finally:
            self.grad_sync.enabled = True

    # -------------------------------------------------------------- clipping
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the norm of the full model's averaged gradient (the same on every worker); returns it as a
        float64 device scalar. The factor min(1, max_norm / (norm + 1e-6)) is applied on the device (a factor of
        1 leaves a gradient bit for bit), so clipping never waits for the device."""
        parts = {w: _sum_sq(self._counted_grads(w, sub), self.device).reshape(1) for w, sub in self.subs.items()}
        norm = self.comm.sum_all(parts).sum().sqrt()
        if max_norm > 0:
            scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
            grads = [p.grad for m in self.modules.values() for p in m.parameters() if p.grad is not None]
            for g in grads:
                g.mul_(scale)
        return norm

    def _counted_grads(self, w: int, sub: Subnet) -> list[torch.Tensor]:
        """The gradients worker w counts in the norm: with holder-sharded FSDP2 its local shards (every element
        lives on exactly one rank), else each component's at its first holder and the shared ones at worker 0."""
        if self.fsdp_does_averaging:
            return [local(p.grad) for p in self.modules[w].parameters() if p.grad is not None]
        pieces = [p for c, pcs in sub.pieces.items() if self.plan.holders(c)[0] == w for p in pcs]
        pieces += sub.shared if w == 0 else []
        return [p.view(local(p.param.grad)) for p in pieces if p.param.grad is not None]

    # ---------------------------------------------------- backward-regime refresh
    @torch.no_grad()
    def refresh(self) -> None:
        """Backward regime: broadcast each stale component from its refresh root to its non-holders."""
        self.steps += 1
        if self.regime != "backward" or self.plan.world_size == 1 or self.steps % self.refresh_every:
            return
        drift = torch.zeros((), device=self.device)  # read only when reported: no wait for the device here
        for c, members in self.refresh_sets.items():  # in plan order on every rank: deadlock-free
            here = [w for w in self.comm.workers if w in members]
            if not here:
                continue
            flats = {w: torch.cat([v.reshape(-1) for v in self.subs[w].views[c]]) for w in here}
            before = {w: flats[w].clone() for w in here if not self.plan.mask[w, c]}
            root = next(w for w in members if self.plan.mask[w, c])
            self.comm.broadcast(members, flats, root)
            for w, old in before.items():
                drift = torch.maximum(drift, (flats[w] - old).abs().max().float()) if old.numel() else drift
                offset = 0
                for v in self.subs[w].views[c]:
                    v.copy_(flats[w][offset:offset + v.numel()].view_as(v))
                    offset += v.numel()
        self._drift = drift

    @property
    def last_drift(self) -> float:
        """The largest change a refresh made to a stale copy, at the last refresh (reading it waits for the
        device)."""
        return float(self._drift) if self._drift is not None else 0.0

    # -------------------------------------------------------- replica checks
    @torch.no_grad()
    def check_replicas(self) -> None:
        """Raise, naming the component, unless all holders' copies are bit-identical."""
        if self.fsdp_does_averaging or self.plan.world_size == 1:  # sharded, not replicated
            return
        items = {w: self._items(sub) for w, sub in self.subs.items()}
        sets = sorted({h for its in items.values() for _, h, _ in its if len(h) > 1})
        for hs in sets:
            mine = {w: [(c, pcs) for c, h, pcs in its if h == hs] for w, its in items.items() if w in hs}
            prints = {w: torch.tensor([_print(pcs) for _, pcs in m], dtype=torch.int64, device=self.device)
                      for w, m in mine.items()}
            got = torch.stack(self.comm.all_gather(hs, prints)).tolist()  # (k, components): one copy to the host
            for w, m in mine.items():
                for j, (c, _) in enumerate(m):
                    if any(row[j] != got[hs.index(w)][j] for row in got):
                        name = "shared parameters" if c < 0 else self.plan.components[c].name
                        raise ReplicaMismatch(f"SDP replicas of {name} differ across holders {list(hs)}")

    def _items(self, sub: Subnet) -> list[tuple[int, tuple[int, ...], list[Piece]]]:
        items = [(c, self.plan.holders(c), sub.pieces[c]) for c in sorted(sub.pieces)]
        return items + [(-1, self.everyone, sub.shared)]

    # --------------------------------------------------------------- gather
    def local_full_tensors(self, w: int) -> dict[str, torch.Tensor]:
        """Worker w's unsharded parameters and buffers under full-model names (split tensors rebuilt whole;
        FSDP2: all-gathered within the worker's shards)."""
        module = self.modules[w]
        if self.fsdp_does_averaging:  # blocks sharded over different holder groups: gather in model order
            params = module.named_parameters()
            tensors = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p) for n, p in params}
            return tensors | dict(module.named_buffers())
        if self.comm.fsdp > 1:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            sd = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
            return dict(sd) | {n: b for n, b in module.named_buffers() if n not in sd}
        tensors = dict(module.named_parameters()) | dict(module.named_buffers())
        for name, (mod, attr, dim) in self.subs[w].split.items():  # backward regime: held + frozen parts
            tensors[name] = torch.cat([getattr(mod, attr + "_held"), getattr(mod, attr + "_frozen")], dim)
        return tensors

    def gather_full_model(self, skeleton: nn.Module, device: torch.device | str | None = None,
                          rescale: str = "none", dst: int | None = None) -> nn.Module | None:
        """The full model on ``device`` (default: the workers' own), each tensor taken from one holder
        (collective: every rank calls). ``dst`` None: every rank gets it; else only worker ``dst`` (its first
        shard), and the other ranks send what it needs and return None."""
        mine = {w: self.local_full_tensors(w) for w in self.subs}
        device = self.device if device is None else torch.device(device)
        if dst is None:
            move, receives = self.comm.broadcast_from, True
        else:
            move, receives = partial(self.comm.send_to, dst=dst), dst in self.subs and self.comm.shard == 0
        full = gather_full_model(mine, skeleton, self.plan, self.subs, move, device, receives)
        if full is None:
            return None
        if rescale == "survival":
            for c, comp in enumerate(self.plan.components):
                if comp.index is None:
                    full.get_submodule(comp.name).residual_scale = len(self.plan.holders(c)) / self.plan.world_size
        return full


def _bind(sub: Subnet, module: nn.Module) -> None:
    """Point the pieces at the module's parameters as they are now (FSDP2 replaces them with DTensors)."""
    params = dict(module.named_parameters())
    for p in [q for pieces in sub.pieces.values() for q in pieces] + sub.shared:
        p.param = params[p.name]


def _device(modules: Iterable[nn.Module]) -> torch.device:
    """The device of the first parameter (its local shard under FSDP2); the CPU when there is none."""
    p = next((p for m in modules for p in m.parameters()), None)
    return local(p).device if p is not None else torch.device("cpu")


def _sum_sq(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Σ g² over ``grads`` as one float64 scalar on their device (a zero on ``device`` when there are none)."""
    if not grads:
        return torch.zeros((), dtype=torch.float64, device=device)
    return torch.stack([g.double().pow(2).sum() for g in grads]).sum()


def _print(pieces: list[Piece]) -> int:
    return fingerprint(p.view(local(p.param.detach())) for p in pieces)
