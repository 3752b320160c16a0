"""``SubnetworkDataParallel``: the user-facing SDP wrapper (DDP-shaped).

Each worker holds and trains only its subnetwork (METHODS.md Part 1). Communication phases:

1. construction (collective): one process group per distinct holder set, created in the plan's
   order on every rank; no parameters are sent (the model is built from the same seed everywhere);
2. every step, during backward: holder-group averaging of gradients, bucketed by holder set and
   overlapped with backward (:mod:`slimpar.sdp.sync`); ``sync()`` waits for it;
3. gradient clipping: one scalar all-reduce gives the norm of the full averaged gradient, so every
   holder clips by the same factor;
4. backward regime, after the optimizer step: every block is broadcast from one of its holders (roots
   spread over the holders: :mod:`slimpar.sdp.roots`) to the workers that do not hold it (``refresh()``,
   every ``refresh_every`` steps);
5. every ``sdp.check_every`` steps: ``check_replicas()`` compares BLAKE2b digests of the bytes among holders;
   ``gather_full_model()`` broadcasts every component from one holder.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from slimpar.sdp.apply import Subnet, apply_subnet
from slimpar.sdp.components import model_components
from slimpar.sdp.gather import gather_full_model, meta_skeleton
from slimpar.sdp.plan import Plan
from slimpar.sdp.roots import refresh_members, refresh_roots
from slimpar.sdp.sync import GradSync, HolderGroups, Piece, local, make_buckets


class SubnetworkDataParallel(nn.Module):
    """Wrap a full single-device model; afterwards it holds only this rank's subnetwork.

    Args:
        module: the full model (identical on every rank, e.g. built from the same seed).
        plan: the mask plan (``slimpar.sdp.plan_blocks`` / ``plan_neurons``); worker i = rank i.
        regime: "forward" (run the subnetwork) or "backward" (full forward, masked gradients).
        group: the group of all SDP workers (default: WORLD when torch.distributed is initialized,
            else a single process with no communication).
        bucket_mb: bucket size for gradient all-reduces.
        refresh_every: backward regime: refresh non-held blocks every T steps.
    """

    def __init__(self, module: nn.Module, plan: Plan, regime: str = "forward",
                 group: dist.ProcessGroup | None = None, bucket_mb: float = 25.0,
                 refresh_every: int = 1, overlap: bool = True, shared_names: list[str] | None = None,
                 fsdp: int = 1, parallelize=None, fsdp_does_averaging: bool = False,
                 timeout: timedelta | None = None):
        super().__init__()
        if group is None and dist.is_initialized():
            group = dist.group.WORLD
        self.plan, self.regime, self.group, self.refresh_every = plan, regime, group, refresh_every
        self.fsdp = fsdp
        grank = dist.get_rank(group) if group is not None else 0
        self.rank, self.shard = divmod(grank, fsdp)  # SDP worker index and FSDP shard index
        world = dist.get_world_size(group) if group is not None else 1
        if plan.world_size * fsdp != world:
            raise ValueError(f"the plan is for {plan.world_size} workers x {fsdp} FSDP shards; the group has {world}")
        if fsdp > 1 and regime != "forward":
            raise ValueError("SDP with FSDP2 shards forward-masked subnetworks (regime='forward')")
        if shared_names is None and plan.shared_params:
            shared_names = list(plan.shared_params)
        if shared_names is None:
            level = "neuron" if any(c.index is not None for c in plan.components) else "block"
            _, shared_names, _ = model_components(module, level, _groups_of(plan))
        self.skeleton = [meta_skeleton(module)]  # a list keeps it out of this module's children
        self.sub: Subnet = apply_subnet(module, plan, self.rank, shared_names, regime)
        if parallelize is not None:  # e.g. activation checkpointing and FSDP2's fully_shard
            parallelize(module)
            _rebind(self.sub, module)
        self.module = module
        self.steps = 0
        self.last_drift = 0.0
        self.refresh_sets = refresh_sets(plan) if regime == "backward" else {}
        sets = list(plan.distinct_holder_sets) + list(self.refresh_sets.values())
        self.holder_groups = HolderGroups(sets, plan.world_size, fsdp=fsdp, world_group=group,
                                          timeout=timeout) if group is not None else None
        # FSDP2 hands back sharded gradients after its own reduce-scatter, not through autograd's
        # accumulation hooks, so with an FSDP dimension the holder all-reduce runs after backward.
        self.fsdp_does_averaging = fsdp_does_averaging  # holder-sharded FSDP2: its reduce-scatter averages
        cap = int(bucket_mb * 2**20)
        self.grad_sync = None if fsdp_does_averaging else self._build_sync(cap, overlap and fsdp == 1)

    # ------------------------------------------------------------ gradient sync
    def _build_sync(self, cap: int, overlap: bool) -> GradSync | None:
        if self.holder_groups is None:
            return None
        by_set: dict[tuple[int, ...], list[Piece]] = {}
        for c in sorted(self.sub.pieces, reverse=True):  # backward visits late components first
            by_set.setdefault(self.plan.holders(c), []).extend(self.sub.pieces[c])
        everyone = tuple(range(self.plan.world_size))
        by_set.setdefault(everyone, []).extend(reversed(self.sub.shared))
        return GradSync(make_buckets(by_set, self.holder_groups, self.shard, cap), overlap=overlap)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def sync(self) -> None:
        """Finish holder-group averaging (call after backward, before the optimizer step)."""
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
    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip by the norm of the full model's averaged gradient (identical on every worker)."""
        sq = torch.zeros((), dtype=torch.float64)
        if self.fsdp_does_averaging:  # every element lives on exactly one rank's shard
            for p in self.module.parameters():
                if p.grad is not None:
                    sq += local(p.grad).double().pow(2).sum()
            dist.all_reduce(sq, group=self.group)
            return self._scale_grads(float(sq.sqrt()), max_norm)
        for c, pieces in self.sub.pieces.items():
            if self.plan.holders(c)[0] == self.rank:
                sq += sum(_sq(p) for p in pieces)
        if self.rank == 0:
            sq += sum(_sq(p) for p in self.sub.shared)
        if self.group is not None:
            dist.all_reduce(sq, group=self.group)
        return self._scale_grads(float(sq.sqrt()), max_norm)

    def _scale_grads(self, norm: float, max_norm: float) -> float:
        if max_norm > 0 and norm > max_norm:
            scale = max_norm / (norm + 1e-6)
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        return norm

    # ---------------------------------------------------- backward-regime refresh
    @torch.no_grad()
    def refresh(self) -> None:
        """Backward regime: broadcast each component from its refresh root (the one holder among the broadcast's
        members, :func:`slimpar.sdp.roots.refresh_roots`) to the workers that do not hold it."""
        self.steps += 1
        if self.regime != "backward" or self.group is None or self.steps % self.refresh_every:
            return
        drift = 0.0
        for c, members in self.refresh_sets.items():  # in plan order on every rank: deadlock-free
            if self.rank not in members:
                continue
            views = self.sub.views[c]
            flat = torch.cat([v.reshape(-1) for v in views])
            before = flat.clone() if not self.plan.mask[self.rank, c] else None
            root = next(w for w in members if self.plan.mask[w, c])
            dist.broadcast(flat, src=root, group=self.holder_groups.get(members))
            if before is not None:
                drift = max(drift, float((flat - before).abs().max()))
                offset = 0
                for v in views:
                    v.copy_(flat[offset:offset + v.numel()].view_as(v))
                    offset += v.numel()
        self.last_drift = drift

    # -------------------------------------------------------- replica checks
    @torch.no_grad()
    def check_replicas(self) -> None:
        """Raise, naming the component, unless all holders' copies are bit-identical."""
        if self.holder_groups is None or self.fsdp_does_averaging:  # sharded, not replicated
            return
        everyone = tuple(range(self.plan.world_size))
        items = [(c, self.plan.holders(c), self.sub.pieces[c]) for c in sorted(self.sub.pieces)]
        items.append((-1, everyone, self.sub.shared))
        for hs in sorted({h for _, h, _ in items if len(h) > 1}):
            mine = [(c, pcs) for c, h, pcs in items if h == hs]
            prints = torch.tensor([_fingerprint(pcs) for _, pcs in mine], dtype=torch.int64)
            got = [torch.empty_like(prints) for _ in hs]
            dist.all_gather(got, prints, group=self.holder_groups.get(hs, self.shard))
            for j, (c, _) in enumerate(mine):
                if any(int(g[j]) != int(prints[j]) for g in got):
                    name = "shared parameters" if c < 0 else self.plan.components[c].name
                    raise RuntimeError(f"SDP replicas of {name} differ across holders {list(hs)}")

    # --------------------------------------------------------------- gather
    def _local_full_tensors(self) -> dict[str, torch.Tensor]:
        """This worker's unsharded tensors (FSDP2: all-gathered within the worker's shard group)."""
        if self.fsdp == 1 and not self.fsdp_does_averaging:
            tensors = dict(self.module.named_parameters()) | dict(self.module.named_buffers())
            for name, (module, attr, dim) in self.sub.split.items():  # backward regime: held + frozen parts
                tensors[name] = torch.cat([getattr(module, attr + "_held"), getattr(module, attr + "_frozen")], dim)
            return tensors
        if self.fsdp_does_averaging:  # blocks sharded over different holder groups: gather in model order
            params = self.module.named_parameters()
            tensors = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p) for n, p in params}
            return tensors | dict(self.module.named_buffers())
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
        return dict(sd) | {n: b for n, b in self.module.named_buffers() if n not in sd}

    def gather_full_model(self, device: torch.device | str = "cpu", rescale: str = "none") -> nn.Module:
        """The full model, each component taken from one holder (collective: every rank calls)."""
        mine = self._local_full_tensors()
        full = gather_full_model(mine, self.skeleton[0], self.plan, self.sub, self.rank, self.group,
                                 torch.device(device), worker_rank=lambda w: w * self.fsdp)
        if rescale == "survival":
            for c, comp in enumerate(self.plan.components):
                if comp.index is None:
                    full.get_submodule(comp.name).residual_scale = len(self.plan.holders(c)) / self.plan.world_size
        return full


def refresh_sets(plan: Plan) -> dict[int, tuple[int, ...]]:
    """Backward regime: component -> workers in its refresh broadcast (its root, the only holder among them,
    + non-holders), in plan order; components every worker holds are never stale and are left out."""
    return {c: refresh_members(plan, c, root) for c, root in refresh_roots(plan).items()}


def _sq(p: Piece) -> torch.Tensor:
    if p.param.grad is None:
        return torch.zeros((), dtype=torch.float64)
    return p.view(local(p.param.grad)).double().pow(2).sum()


def _rebind(sub: Subnet, module: nn.Module) -> None:
    """Point pieces at the module's current parameters (FSDP2 replaces them with DTensors)."""
    params = dict(module.named_parameters())
    for p in [q for pieces in sub.pieces.values() for q in pieces] + sub.shared:
        p.param = params[p.name]


def _fingerprint(pieces: list[Piece]) -> int:
    """A bit-exact fingerprint without blind spots: BLAKE2b (64-bit digest) of the raw bytes of every piece,
    in order, with each piece's shape and dtype, so any change of any element (or a swap) changes it."""
    h = hashlib.blake2b(digest_size=8)
    for p in pieces:
        t = p.view(local(p.param.detach())).contiguous()
        h.update(f"{tuple(t.shape)}{t.dtype};".encode())
        h.update(t.reshape(-1).view(torch.uint8).cpu().numpy().data)
    return int.from_bytes(h.digest(), "little", signed=True)  # an int64 for the all-gather


def _groups_of(plan: Plan) -> int:
    layers: dict[str, int] = {}
    for c in plan.components:
        if c.index is not None:
            layers[c.layer] = layers.get(c.layer, 0) + 1
    return max(layers.values()) if layers else 4
