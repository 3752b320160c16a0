"""Damaged run folders (``slimpar eval``, ``slimpar export``) and checkpoints (``train --resume``): exit 2, one
message, nothing written (tests/unit/test_bad_input.py says how the cases run)."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.bad_input import TINY_RUN_ARGS, T, copy_run, expect_exit_2, flip, truncate, write

# ---------------------------------------------------------------- run folders: eval and export



RUN_DEFECTS: dict[str, Callable[[Path], None]] = {
    "no-manifest": lambda r: (r / "manifest.json").unlink(),
    "truncated-export": lambda r: truncate(r / "model.safetensors"),
    "flipped-byte-in-export": lambda r: flip(r / "model.safetensors"),
    "flipped-byte-in-header": lambda r: flip(r / "model.safetensors", at=20),
    "export-missing": lambda r: (r / "model.safetensors").unlink(),
    "manifest-garbage": lambda r: write(r / "manifest.json", "{not json"),
    "manifest-without-export": lambda r: write(r / "manifest.json", json.dumps({"format": 1, "files": {}})),
    "manifest-escapes-folder": lambda r: write(r / "manifest.json", json.dumps(
        {"format": 1, "files": {"../x": {"sha256": "0" * 64, "size": 1}}})),
    "config-missing": lambda r: (r / "config.toml").unlink(),
    "config-not-toml": lambda r: write(r / "config.toml", "[model\n"),
    "config-unknown-key": lambda r: write(r / "config.toml", (r / "config.toml").read_text() + "\n[extra]\nx = 1\n"),
}
RUN_MATCH = {
    "no-manifest": ("no manifest.json", "python -m slimpar.train.checkpoint.manifest write"),
    "truncated-export": ("model.safetensors", "truncated"),
    "flipped-byte-in-export": ("model.safetensors", "sha256"),
    "flipped-byte-in-header": ("model.safetensors", "sha256"),
    "export-missing": ("model.safetensors", "not found"),
    "manifest-garbage": ("not a valid slimpar manifest",),
    "manifest-without-export": ("does not list model.safetensors",),
    "manifest-escapes-folder": ("outside its folder",),
    "config-missing": ("config.toml", "not found"),
    "config-not-toml": ("config.toml", "not valid TOML"),
    "config-unknown-key": ("unknown config key 'extra'",),
}


@pytest.mark.parametrize("defect", list(RUN_DEFECTS))
def test_eval_refuses_a_bad_run_folder(defect, tiny_run, tmp_path, capsys):
    run = copy_run(tiny_run, tmp_path / "run")
    RUN_DEFECTS[defect](run)
    expect_exit_2(["eval", "--run", str(run)], tmp_path, capsys, RUN_MATCH[defect])


@pytest.mark.parametrize("defect", [d for d in RUN_DEFECTS if d != "config-unknown-key"])
def test_export_refuses_a_bad_run_folder(defect, tiny_run, tmp_path, capsys):
    run = copy_run(tiny_run, tmp_path / "run")
    RUN_DEFECTS[defect](run)
    expect_exit_2(["export", "--hf", str(run), str(tmp_path / "hf")], tmp_path, capsys, RUN_MATCH[defect])


EVAL_PATH_CASES: list[tuple[str, Callable[[Path], str], str | tuple[str, ...]]] = [
    ("missing-folder", lambda d: str(d / "nope"), ("not found", "slimpar train")),
    ("empty-folder", lambda d: (d / "empty").mkdir() or str(d / "empty"), ("config.toml", "not found")),
    ("a-file", lambda d: str(write(d / "file", "x")), "not found"),
    ("only-a-config", lambda d: str(write(d / "partial" / "config.toml", "[model]\n").parent),
     ("model.safetensors", "checkpoint.export = true")),
]


@pytest.mark.parametrize("name, run, match", EVAL_PATH_CASES, ids=[c[0] for c in EVAL_PATH_CASES])
def test_eval_and_export_refuse_a_missing_or_partial_folder(name, run, match, tmp_path, capsys):
    path = run(tmp_path)
    expect_exit_2(["eval", "--run", path], tmp_path, capsys, match)
    expect_exit_2(["export", "--hf", path, str(tmp_path / "hf")], tmp_path, capsys, match)


def test_eval_refuses_a_model_that_does_not_fit_the_weights(tiny_run, tmp_path, capsys):
    run = copy_run(tiny_run, tmp_path / "run")
    expect_exit_2(["eval", "--run", str(run), "--model.size", "small"], tmp_path, capsys,
                  ("does not fit the model", "drop the --model.* overrides"))


def test_eval_refuses_a_bad_override(tiny_run, tmp_path, capsys):
    run = copy_run(tiny_run, tmp_path / "run")
    expect_exit_2(["eval", "--run", str(run), "--train.stepz", "3"], tmp_path, capsys, "unknown config key")


def test_export_refuses_an_out_that_is_a_file_or_not_empty(tiny_run, tmp_path, capsys):
    run = copy_run(tiny_run, tmp_path / "run")
    out = write(tmp_path / "hf", "a file")
    expect_exit_2(["export", "--hf", str(run), str(out)], tmp_path, capsys, ("not empty", "new folder"))
    out.unlink()
    write(tmp_path / "hf" / "keep.txt", "mine")
    expect_exit_2(["export", "--hf", str(run), str(tmp_path / "hf")], tmp_path, capsys, "not empty")


def test_export_refuses_a_non_llama_run(tiny_run, tmp_path, capsys):
    from slimpar.train.checkpoint.manifest import write_manifest

    run = copy_run(tiny_run, tmp_path / "run")
    text = (run / "config.toml").read_text().replace('arch = "llama"', 'arch = "resnet18"')
    write(run / "config.toml", text)
    write_manifest(run, ["model.safetensors"])
    expect_exit_2(["export", "--hf", str(run), str(tmp_path / "hf")], tmp_path, capsys, "only LLaMA runs")


# ---------------------------------------------------------------- checkpoints: train --resume

class _Crafted:
    """A pickle that would run a shell command when loaded (os.system through __reduce__)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _ckpt(run: Path) -> Path:
    (path,) = sorted((run / "checkpoints").iterdir())
    return path


def _shard(run: Path) -> Path:
    return sorted(_ckpt(run).glob("*.distcp"))[0]


CKPT_DEFECTS: dict[str, Callable[[Path], None]] = {
    "truncated-shard": lambda r: truncate(_shard(r)),
    "empty-shard": lambda r: truncate(_shard(r), 0.0),
    "flipped-byte-in-shard": lambda r: flip(_shard(r)),
    "flipped-first-byte-of-shard": lambda r: flip(_shard(r), at=0),
    "shard-missing": lambda r: _shard(r).unlink(),
    "trainer-json-step-999": lambda r: write(_ckpt(r) / "trainer.json", json.dumps({"step": 999})),
    "trainer-json-garbage": lambda r: write(_ckpt(r) / "trainer.json", "{step"),
    "metadata-missing": lambda r: (_ckpt(r) / ".metadata").unlink(),
    "metadata-truncated": lambda r: truncate(_ckpt(r) / ".metadata"),
    "metadata-crafted-pickle": lambda r: write(_ckpt(r) / ".metadata", pickle.dumps(_Crafted(r.parent / "pwned"))),
    "manifest-missing": lambda r: (_ckpt(r) / "manifest.json").unlink(),
    "manifest-garbage": lambda r: write(_ckpt(r) / "manifest.json", "[]"),
    "unlisted-file": lambda r: write(_ckpt(r) / "__9_0.distcp", b"extra"),
    "renamed-folder": lambda r: _ckpt(r).rename(_ckpt(r).with_name("step_000002")),
}
CKPT_MATCH = {
    "truncated-shard": ("truncated", "use another checkpoint"),
    "empty-shard": ("truncated", "use another checkpoint"),
    "flipped-byte-in-shard": ("sha256", "use another checkpoint"),
    "flipped-first-byte-of-shard": ("sha256", "use another checkpoint"),
    "shard-missing": ("is missing", "use another checkpoint"),
    "trainer-json-step-999": ("trainer.json", "use another checkpoint"),
    "trainer-json-garbage": ("trainer.json", "use another checkpoint"),
    "metadata-missing": (".metadata is missing",),
    "metadata-truncated": (".metadata", "truncated"),
    "metadata-crafted-pickle": (".metadata", "manifest"),
    "manifest-missing": ("no manifest.json", "manifest write"),
    "manifest-garbage": ("not a valid slimpar manifest",),
    "unlisted-file": ("does not list", "__9_0.distcp"),
    "renamed-folder": ("says step 3", "step_000002"),
}


@pytest.mark.parametrize("defect", list(CKPT_DEFECTS))
def test_resume_refuses_a_bad_checkpoint(defect, tiny_run, tmp_path, capsys):
    run = copy_run(tiny_run, tmp_path / "run")
    CKPT_DEFECTS[defect](run)
    argv = ["train", "--config", T, "--out", str(run), *TINY_RUN_ARGS, "--resume"]
    expect_exit_2(argv, tmp_path, capsys, CKPT_MATCH[defect])
    assert not (tmp_path / "pwned").exists()


def test_resume_of_the_untouched_copy_verifies(tiny_run, tmp_path):
    """The baseline of the checkpoint cases: an untouched copy passes the launcher's check."""
    from slimpar.train.checkpoint.preflight import check_resume

    run = copy_run(tiny_run, tmp_path / "run")
    assert check_resume(run).name == "step_000003"


