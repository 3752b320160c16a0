"""No code runs on load (issue 22, item 2): DCP's ``.metadata`` and the shards' non-tensor entries are read
with restricted unpicklers, so a crafted file is refused even with a matching rewritten manifest."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict

from slimpar.cli import main
from slimpar.train.checkpoint.dcp import OPTIONS, load_checkpoint, save_checkpoint, verify_checkpoint
from slimpar.train.checkpoint.manifest import verify_manifest, write_manifest
from slimpar.train.checkpoint.safe_dcp import UnsafeCheckpointError, dcp_load, read_dcp_metadata


class _System:
    """Runs a shell command when unpickled (``posix.system``)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Exec:
    """Runs Python code when unpickled (``builtins.exec``)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def _model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def _real_checkpoint(root: Path) -> Path:
    model, opt = _model_and_optimizer(0)
    return save_checkpoint(root, 1, model, opt, rank=0)


def _sign(path: Path) -> None:
    """What an attacker who can write the folder does: a manifest that matches the crafted files."""
    write_manifest(path)
    verify_manifest(path)


def test_a_genuine_checkpoint_round_trips(tmp_path):
    path = _real_checkpoint(tmp_path)
    assert isinstance(read_dcp_metadata(path / ".metadata").state_dict_metadata, dict)
    want, want_opt = _model_and_optimizer(0)
    model, opt = _model_and_optimizer(1)
    assert load_checkpoint(path, model, opt) == 1
    for a, b in zip(model.parameters(), want.parameters(), strict=True):
        assert torch.equal(a, b)
        assert torch.equal(opt.state[a]["exp_avg"], want_opt.state[b]["exp_avg"])
    assert opt.param_groups[0]["lr"] == 1e-2 and opt.param_groups[0]["betas"] == (0.9, 0.999)


def _crafted_metadata(kind: str, path: Path, marker: Path) -> bytes:
    if kind == "os.system":
        return pickle.dumps(_System(marker))
    if kind == "builtins.exec":
        return pickle.dumps(_Exec(marker))
    md = read_dcp_metadata(path / ".metadata")
    if kind == "unexpected-class":
        md.storage_meta = argparse.Namespace(note="not a DCP class")
    else:  # a shard outside the folder
        index = next(iter(md.storage_data))
        md.storage_data[index].relative_path = "../../../etc/passwd"
    return pickle.dumps(md)


CRAFTED = {"os.system": "refers to posix.system", "builtins.exec": "refers to builtins.exec",
           "unexpected-class": "refers to argparse.Namespace", "shard-outside": "points to shard '../../../etc/passwd'"}


@pytest.mark.parametrize("kind", list(CRAFTED))
def test_crafted_metadata_with_a_matching_manifest_is_refused_unrun(kind, tmp_path, capsys):
    path = _real_checkpoint(tmp_path)
    marker = tmp_path / "pwned"
    (path / ".metadata").write_bytes(_crafted_metadata(kind, path, marker))
    _sign(path)
    message = f"{path / '.metadata'} {CRAFTED[kind]}"
    with pytest.raises(UnsafeCheckpointError, match=re.escape(message)):
        verify_checkpoint(path)  # the launcher's preflight and every worker, before DCP
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint(path, *_model_and_optimizer(1))
    model_sd, optim_sd = get_state_dict(*_model_and_optimizer(1), options=OPTIONS)
    with pytest.raises(UnsafeCheckpointError, match=re.escape(message)):  # DCP's own read, if the file changed
        dcp_load({"model": model_sd, "optim": optim_sd}, path)  # after the check: still refused, and unwrapped
    assert main(["train", "--out", str(tmp_path), "--resume"]) == 2  # the CLI: exit 2 before anything starts
    err = capsys.readouterr().err
    assert err.startswith("slimpar: error: ") and CRAFTED[kind] in err and "Traceback" not in err
    assert not marker.exists()


def test_crafted_bytes_entry_in_a_shard_is_refused_unrun(tmp_path):
    """The metadata is genuine; a shard's non-tensor entry (an optimizer lr) runs a command when DCP's
    default planner unpickles it (torch.load with weights_only=False)."""
    marker = tmp_path / "pwned"
    model, opt = _model_and_optimizer(0)
    model_sd, optim_sd = get_state_dict(model, opt, options=OPTIONS)
    key = next(k for k in optim_sd if k.endswith(".lr"))
    optim_sd[key] = _System(marker)
    path = tmp_path / "checkpoints" / "step_000001"
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
    (path / "trainer.json").write_text(json.dumps({"step": 1}))
    _sign(path)
    assert verify_checkpoint(path) == 1
    with pytest.raises(UnsafeCheckpointError, match=f"holds entry 'optim.{key}'.*posix.system"):
        load_checkpoint(path, *_model_and_optimizer(1))
    assert not marker.exists()
