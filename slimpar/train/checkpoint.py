"""Checkpoints with torch.distributed.checkpoint (DCP) and export of the full model to safetensors.

A checkpoint is ``OUT/checkpoints/step_{N:06d}/``: DCP shards of the model and optimizer state
(each rank writes what it holds; replicas are deduplicated by DCP's planner) plus ``trainer.json``
with the step. The optimizer state is flattened to keys named by parameter (``state.<fqn>.exp_avg``,
``param_groups.<fqn>.lr``): ranks that hold different parameters (SDP subnetworks, pipeline stages)
build different param-group lists, and index-keyed groups (``param_groups.0``) would be deduplicated
across ranks as if they were replicas, losing every rank's groups but one. Data order and
augmentation are pure functions of (seed, step), so the step is all the loader needs to resume exactly.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)  # keys by parameter name: see above

_STEP_DIR = re.compile(r"^step_(\d{6})$")


def checkpoint_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "checkpoints"


def latest_checkpoint(out_dir: Path) -> Path | None:
    root = checkpoint_dir(out_dir)
    if not root.is_dir():
        return None
    done = [d for d in root.iterdir() if _STEP_DIR.match(d.name) and (d / "trainer.json").is_file()]
    return max(done, key=lambda d: d.name) if done else None


def save_checkpoint(out_dir: Path, step: int, model, optimizer, rank: int, group=None) -> Path:
    """Save model + optimizer after ``step`` steps. ``trainer.json`` is written last, by rank 0,
    so a directory without it is an interrupted save and is never resumed from."""
    path = checkpoint_dir(out_dir) / f"step_{step:06d}"
    model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIONS)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path), process_group=group)
    if dist.is_initialized():
        dist.barrier(group=group)
    if rank == 0:
        tmp = path / "trainer.json.tmp"
        tmp.write_text(json.dumps({"step": step}))
        os.replace(tmp, path / "trainer.json")
    return path


def load_checkpoint(path: Path, model, optimizer, group=None) -> int:
    """Load into ``model``/``optimizer`` in place; returns the number of steps already done."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIONS)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path), process_group=group)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=OPTIONS)
    return int(json.loads((path / "trainer.json").read_text())["step"])


def export_safetensors(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """Write the full model; a weight tied to another (same storage) is stored once and noted."""
    from safetensors.torch import save_file

    seen: dict[tuple[int, int], str] = {}
    tensors: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen and t.shape == state[seen[key]].shape:
            tied[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.detach().contiguous().cpu()
    meta = dict(metadata, tied=json.dumps(tied))
    save_file(tensors, str(path), metadata=meta)


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Read an export back, restoring tied names."""
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt") as f:
        for k in f.keys():
            out[k] = f.get_tensor(k)
        tied = json.loads((f.metadata() or {}).get("tied", "{}"))
    for name, src in tied.items():
        out[name] = out[src]
    return out
