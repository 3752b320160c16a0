"""The pieces of an SDP checkpoint: which full-model name and slice each local tensor is, and who writes it.

Helpers of :mod:`slimpar.train.checkpoint.sdp` (one worker's names, neuron-level slices, the first holder that
writes each tensor); pure functions of the plan and the state dicts, no communication.
"""

from __future__ import annotations

import torch

from slimpar.sdp.apply import unit_position

STATS = ("exp_avg", "exp_avg_sq")  # AdamW's per-element state, shaped like its parameter


# ---------------------------------------------------------------- one worker's names (sub: its Subnet)
def _where(sub, name: str, local: torch.Tensor) -> tuple[str, int, torch.Tensor | None]:
    """A local state-dict name -> (full name, dim, global indices of its rows/columns or None)."""
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


def _local_tensor(sub, full: str, stat: str, model_sd: dict, optim_sd: dict):
    """The worker's tensor behind ``full`` (model, or an optimizer stat) and its global indices."""
    if full in sub.split:
        dim, perm = sub.index_map[full]
        if stat == "model":
            return torch.cat([model_sd[full + "_held"], model_sd[full + "_frozen"]], dim), perm
        held = model_sd[full + "_held"]
        return optim_sd[f"state.{full}_held.{stat}"], perm[:held.shape[dim]]
    _, idx = sub.index_map[full]
    return (model_sd[full] if stat == "model" else optim_sd[f"state.{full}.{stat}"]), idx


def _piece(sub, name: str, stat: str, model_sd: dict, optim_sd: dict, dim: int, start: int, stop: int):
    """The worker's slice [start, stop) (global indices along ``dim``) of ``name``'s model tensor or stat."""
    local, idx = _local_tensor(sub, name, stat, model_sd, optim_sd)
    pos = unit_position(idx, start)
    return local.narrow(dim, pos, stop - start).contiguous()


def _whole_entries(sub, rank: int, model_sd: dict, optim_sd: dict, writer: dict, sliced: set) -> tuple[dict, dict]:
    """Worker ``rank``'s entries it writes whole, under full names (sliced tensors' stats come assembled)."""
    out_m: dict = {}
    out_o: dict = {}
    for k, v in model_sd.items():
        full, _, _ = _where(sub, k, v)
        if full not in sliced and writer[full] == rank:
            out_m[full] = v
    for k, v in optim_sd.items():
        kind, rest = k.split(".", 1)
        p, key = rest.rsplit(".", 1)
        full, _, _ = _where(sub, p, model_sd[p])
        if writer[full] != rank or (full in sliced and kind == "state" and key in STATS):
            continue
        out_o[f"{kind}.{full}.{key}"] = v
    return out_m, out_o


def _put(out_m: dict, out_o: dict, full: str, stat: str, t: torch.Tensor) -> None:
    if stat == "model":
        out_m[full] = t
    else:
        out_o[f"state.{full}.{stat}"] = t


def _request(sub, model_sd: dict, optim_sd: dict, shapes: dict, state: dict) -> dict:
    """Add the full-name tensors a worker needs to ``state`` (DCP reads into them); returns, per local key,
    where its value comes from: (section, full key, dim, global indices or None)."""
    want_m, want_o = state["model"], state["optim"]
    where: dict[str, tuple[str, str, int, torch.Tensor | None]] = {}
    for k, v in model_sd.items():
        full, dim, idx = _where(sub, k, v)
        want_m.setdefault(full, torch.empty(shapes[full], dtype=v.dtype, device=v.device))
        where[k] = ("model", full, dim, idx)
    for k, v in optim_sd.items():
        kind, rest = k.split(".", 1)
        p, key = rest.rsplit(".", 1)
        full, dim, idx = _where(sub, p, model_sd[p])
        fk = f"{kind}.{full}.{key}"
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            want_o.setdefault(fk, torch.empty(shapes[full], dtype=v.dtype, device=v.device))
        else:
            want_o[fk] = v.clone() if isinstance(v, torch.Tensor) else v
            idx = None
        where["optim:" + k] = ("optim", fk, dim, idx)
    return where


def _taken(state: dict, where: dict, model_sd: dict, optim_sd: dict, own: bool = False) -> tuple[dict, dict]:
    """The worker's state dicts with every value taken from the loaded full state; ``own``: whole tensors
    copied, so that workers in one process do not share one optimizer moment (AdamW would update it N times)."""
    return ({k: _take(state, *where[k], own) for k in model_sd},
            {k: _take(state, *where["optim:" + k], own) for k in optim_sd})


def _unprefix(key: str) -> tuple[int, str]:
    """``worker{w}.module.<name>`` -> (w, name)."""
    head, _, local = key.split(".", 2)
    return int(head[len("worker"):]), local


def _slices(plan, shapes: dict):
    """(name, stat, dim, (start, stop), first holder) of every neuron-level slice to save, in plan order
    (the same on every rank: the real run's point-to-point sends follow it)."""
    for c, comp in enumerate(plan.components):
        if comp.index is None:
            continue
        src = plan.holders(c)[0]
        entries = [(n, d, ("model", *STATS)) for n, d in zip(comp.params, comp.dims, strict=True)]
        entries += [(n, d, ("model",)) for n, d in zip(comp.buffers, comp.buffer_dims, strict=True)]
        for name, dim, stats in entries:
            if name not in shapes:  # a non-persistent buffer: not saved
                continue
            for stat in stats:
                yield name, stat, dim, comp.index, src


def _sliced(plan) -> set[str]:
    return {n for comp in plan.components if comp.index is not None for n in comp.params + comp.buffers}


def _take(state: dict, section: str, key: str, dim: int, idx: torch.Tensor | None, own: bool = False):
    v = state[section][key]
    if not isinstance(v, torch.Tensor):
        return v
    if idx is None:
        return v.clone() if own else v
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
