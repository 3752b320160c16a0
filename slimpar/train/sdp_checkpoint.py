"""Reshardable SDP checkpoints: one copy of every tensor, under the full model's own names.

The checkpoint of an SDP run without FSDP has the format of a single-process (or DDP) checkpoint
(:mod:`slimpar.train.checkpoint`): ``model.<name>`` holds each full-model parameter and persistent
buffer in its full shape, and ``optim.state.<name>.{exp_avg,exp_avg_sq,step}`` /
``optim.param_groups.<name>.<key>`` hold AdamW's state flattened by parameter name
(``StateDictOptions(flatten_optimizer_state_dict=True)``). So SDP with any worker count, keep, level,
regime or plan, and single, DDP and FSDP2 runs, can resume from it, and an SDP run can resume from theirs.

Who writes what: holders of a component have bitwise identical parameters and optimizer state (they
average gradients over their holders every step and run the same AdamW), so one copy is exact. The
**first holder** of a component writes it (the shared parameters and anything outside the plan's
components: worker 0). Whole tensors (blocks, shared parameters) go straight from that rank into DCP;
each rank's state dict holds only the entries it writes, so nothing is stored twice. Neuron-level
tensors are slices of full tensors (``Subnet.index_map``: which global rows/columns a local tensor
holds, in the backward regime split into ``<name>_held`` / ``<name>_frozen``): they are assembled on
the first holder of the layer's first group, each group's slice sent to it point to point by the
group's own first holder (model, ``exp_avg`` and ``exp_avg_sq``; in plan order on every rank).
Non-first holders' BatchNorm running statistics are not saved: evaluation and export use the first
holder's, and training reads batch statistics, so a resume stays exact. In the backward regime with
``refresh_every > 1`` a non-holder's stale copy is replaced by its holder's on resume.

Memory: saving holds, on the writing rank, the full neuron-level tensors it writes (parameters and
two moments) until DCP has written them; other ranks one slice at a time. Loading reads the full
tensor of every name a rank holds (and its two moments) and keeps the rank's slice, so a rank briefly
holds up to 3x the full model's parameters, fine at this project's sizes (llama_small: ~0.2 GB).

SDP with FSDP2 (``sdp.fsdp > 1`` or ``sdp.holder_shard``) keeps the DTensor format tied to its
layout (a resume must use the same SDP config; :func:`slimpar.train.checkpoint.check_layout`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from slimpar.train.safe_dcp import dcp_load

STATS = ("exp_avg", "exp_avg_sq")  # AdamW's per-element state, shaped like its parameter


class SDPFullState:
    """What the trainer hands to ``save_checkpoint`` / ``load_checkpoint`` for an SDP run without FSDP."""

    def __init__(self, wrapper, options):
        self.wrapper, self.options = wrapper, options
        self.inner = wrapper.module  # the subnetwork, under the full model's parameter names
        skeleton = wrapper.skeleton[0]
        self.shapes = {n: tuple(t.shape) for n, t in skeleton.state_dict(keep_vars=True).items()}
        plan = wrapper.plan
        self.sliced = {n for comp in plan.components if comp.index is not None for n in comp.params + comp.buffers}
        self.writer = _writers(plan, self.shapes)

    # ------------------------------------------------------------------ names
    def _where(self, name: str, local: torch.Tensor) -> tuple[str, int, torch.Tensor | None]:
        """A local state-dict name -> (full name, dim, global indices of its rows/columns or None)."""
        sub = self.wrapper.sub
        for suffix in ("_held", "_frozen"):
            full = name[: -len(suffix)]
            if name.endswith(suffix) and full in sub.split:
                dim, perm = sub.index_map[full]
                k = local.shape[dim]
                return full, dim, perm[:k] if suffix == "_held" else perm[perm.numel() - k:]
        if name in sub.index_map:
            dim, idx = sub.index_map[name]
            return name, dim, idx
        return name, 0, None

    def _local_tensor(self, full: str, stat: str, model_sd: dict, optim_sd: dict):
        """This rank's tensor behind ``full`` (model, or an optimizer stat) and its global indices."""
        sub = self.wrapper.sub
        if full in sub.split:
            dim, perm = sub.index_map[full]
            if stat == "model":
                return torch.cat([model_sd[full + "_held"], model_sd[full + "_frozen"]], dim), perm
            held = model_sd[full + "_held"]
            return optim_sd[f"state.{full}_held.{stat}"], perm[:held.shape[dim]]
        _, idx = sub.index_map[full]
        return (model_sd[full] if stat == "model" else optim_sd[f"state.{full}.{stat}"]), idx

    # ------------------------------------------------------------------- save
    def state_to_save(self, optimizer) -> tuple[dict, dict]:
        """This rank's share of the full-name state dicts (collective: every rank calls)."""
        model_sd, optim_sd = get_state_dict(self.inner, optimizer, options=self.options)
        rank = self.wrapper.rank
        out_m: dict = {}
        out_o: dict = {}
        for k, v in model_sd.items():
            full, _, _ = self._where(k, v)
            if full not in self.sliced and self.writer[full] == rank:
                out_m[full] = v
        for k, v in optim_sd.items():
            kind, rest = k.split(".", 1)
            p, key = rest.rsplit(".", 1)
            full, _, _ = self._where(p, model_sd[p])
            if self.writer[full] != rank or (full in self.sliced and kind == "state" and key in STATS):
                continue
            out_o[f"{kind}.{full}.{key}"] = v
        for (full, stat), t in self._assemble(model_sd, optim_sd).items():
            if stat == "model":
                out_m[full] = t
            else:
                out_o[f"state.{full}.{stat}"] = t
        return out_m, out_o

    @torch.no_grad()
    def _assemble(self, model_sd: dict, optim_sd: dict) -> dict[tuple[str, str], torch.Tensor]:
        """Neuron-level tensors in full shape on their writer: each group's slice from its first holder."""
        plan, rank, group = self.wrapper.plan, self.wrapper.rank, self.wrapper.group
        fsdp = self.wrapper.fsdp
        out: dict[tuple[str, str], torch.Tensor] = {}
        for c, comp in enumerate(plan.components):
            if comp.index is None:
                continue
            src, (start, stop) = plan.holders(c)[0], comp.index
            entries = [(n, d, ("model", *STATS)) for n, d in zip(comp.params, comp.dims, strict=True)]
            entries += [(n, d, ("model",)) for n, d in zip(comp.buffers, comp.buffer_dims, strict=True)]
            for name, dim, stats in entries:
                if name not in self.shapes:  # a non-persistent buffer: not saved
                    continue
                writer = self.writer[name]
                for stat in stats:
                    ref = model_sd.get(name, model_sd.get(name + "_held"))
                    shape = list(self.shapes[name])
                    if rank == writer and (name, stat) not in out:
                        out[(name, stat)] = torch.zeros(shape, dtype=ref.dtype, device=ref.device)
                    shape[dim] = stop - start
                    if rank not in (src, writer):
                        continue
                    if rank == src:
                        local, idx = self._local_tensor(name, stat, model_sd, optim_sd)
                        pos = int((idx == start).nonzero()[0])
                        piece = local.narrow(dim, pos, stop - start).contiguous()
                    else:
                        piece = torch.empty(shape, dtype=ref.dtype, device=ref.device)
                    if group is not None and src != writer:  # point to point: only the writer needs it
                        if rank == src:
                            dist.send(piece, group=group, group_dst=writer * fsdp)
                        elif rank == writer:
                            dist.recv(piece, group=group, group_src=src * fsdp)
                    if rank == writer:
                        out[(name, stat)].narrow(dim, start, stop - start).copy_(piece)
        return out

    # ------------------------------------------------------------------- load
    def load_from(self, path: Path, optimizer, group=None) -> None:
        """Take this rank's subnetwork (and the matching optimizer slices) from full-name state."""
        model_sd, optim_sd = get_state_dict(self.inner, optimizer, options=self.options)
        want_m: dict = {}
        want_o: dict = {}
        where: dict[str, tuple[str, str, int, torch.Tensor | None]] = {}  # local key -> (section, full key, dim, idx)
        for k, v in model_sd.items():
            full, dim, idx = self._where(k, v)
            want_m.setdefault(full, torch.empty(self.shapes[full], dtype=v.dtype, device=v.device))
            where[k] = ("model", full, dim, idx)
        for k, v in optim_sd.items():
            kind, rest = k.split(".", 1)
            p, key = rest.rsplit(".", 1)
            full, dim, idx = self._where(p, model_sd[p])
            fk = f"{kind}.{full}.{key}"
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                want_o[fk] = torch.empty(self.shapes[full], dtype=v.dtype, device=v.device)
            else:
                want_o[fk] = v.clone() if isinstance(v, torch.Tensor) else v
                idx = None
            where["optim:" + k] = ("optim", fk, dim, idx)
        state = {"model": want_m, "optim": want_o}
        dcp_load(state, path, group)  # unpickles nothing but DCP's metadata classes and plain data
        for k in list(model_sd):
            model_sd[k] = _take(state, *where[k])
        for k in list(optim_sd):
            optim_sd[k] = _take(state, *where["optim:" + k])
        set_state_dict(self.inner, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                       options=self.options)


def _take(state: dict, section: str, key: str, dim: int, idx: torch.Tensor | None):
    v = state[section][key]
    if idx is None or not isinstance(v, torch.Tensor):
        return v
    return v.index_select(dim, idx.to(v.device))


def _writers(plan, names) -> dict[str, int]:
    """Full tensor name -> the worker that writes it: a component's first holder (a neuron layer's: the
    first holder of its first group; a block's buffers: the block's), else worker 0 (shared)."""
    out: dict[str, int] = {}
    blocks: dict[str, int] = {}
    for c, comp in enumerate(plan.components):
        src = plan.holders(c)[0]
        for n in comp.params + comp.buffers:
            out.setdefault(n, src)
        if comp.index is None:
            blocks[comp.name] = src
    for n in names:
        if n not in out:
            out[n] = next((s for prefix, s in blocks.items() if n.startswith(prefix + ".")), 0)
    return out
