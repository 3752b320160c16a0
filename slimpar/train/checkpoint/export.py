"""The full model exported to ``model.safetensors`` (tied weights stored once), verified against the run's manifest."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from slimpar.train.checkpoint.manifest import ManifestError, verify_manifest, write_manifest
from slimpar.utils import chmod_as_created


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
    chmod_as_created(path)  # save_file leaves 0600
    write_manifest(path.parent, [path.name])  # the run folder's manifest.json: verified by eval and export


def verify_export(run_dir: Path) -> None:
    """Check ``model.safetensors`` against the run folder's ``manifest.json`` before reading it."""
    files = verify_manifest(run_dir, complete=False)
    if "model.safetensors" not in files:
        raise ManifestError(f"{Path(run_dir) / 'manifest.json'} does not list model.safetensors; the export "
                            "cannot be verified (re-run the training, or if you trust the folder: "
                            f"python -m slimpar.train.checkpoint.manifest write {run_dir})")


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
