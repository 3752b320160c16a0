"""A handful of malformed inputs end to end through ``python -m slimpar`` (the rest of the suite runs
in-process: tests/unit/test_bad_input*.py): exit 2, one message, no traceback, nothing written, and a
crafted pickle in a checkpoint's ``.metadata`` never runs."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest

from tests.bad_input import TINY_RUN_ARGS, tree
from tests.helpers import ROOT, TINY


class _Crafted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _slimpar(*args: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "slimpar", *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd, env=env)


def _check(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("slimpar: error: "), proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def _copy(tiny_run, dest):
    shutil.copytree(tiny_run, dest)
    (dest / "eval.json").unlink(missing_ok=True)
    return dest


@pytest.mark.parametrize("defect", ["crafted-metadata", "trainer-json-999", "flipped-shard"])
def test_resume_refuses_a_tampered_checkpoint(defect, tiny_run, tmp_path):
    run = _copy(tiny_run, tmp_path / "run")
    (ckpt,) = (run / "checkpoints").iterdir()
    if defect == "crafted-metadata":
        (ckpt / ".metadata").write_bytes(pickle.dumps(_Crafted(tmp_path / "pwned")))
    elif defect == "trainer-json-999":
        (ckpt / "trainer.json").write_text(json.dumps({"step": 999}))
    else:
        shard = sorted(ckpt.glob("*.distcp"))[0]
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    before = tree(tmp_path)
    proc = _slimpar("train", "--config", str(TINY), "--out", str(run), *TINY_RUN_ARGS, "--resume", cwd=tmp_path)
    _check(proc, str(ckpt))
    assert not (tmp_path / "pwned").exists()
    assert tree(tmp_path) == before


def test_non_utf8_toml_and_one_byte_text(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_bytes("# caf\xe9\n[train]\nsteps = 2\n".encode("latin-1"))
    one = tmp_path / "one.txt"
    one.write_text("a")
    before = tree(tmp_path)
    _check(_slimpar("train", "--config", str(bad), "--out", str(tmp_path / "run"), cwd=tmp_path), "not UTF-8")
    _check(_slimpar("train", "--config", str(TINY), "--out", str(tmp_path / "run"), "--data.corpus", "path",
                    "--data.path", str(one), "--data.ood", "none", cwd=tmp_path), "--data.seq_len")
    assert tree(tmp_path) == before


def test_eval_and_export_refuse_a_truncated_export(tiny_run, tmp_path):
    run = _copy(tiny_run, tmp_path / "run")
    weights = run / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    before = tree(tmp_path)
    _check(_slimpar("eval", "--run", str(run), cwd=ROOT), "truncated")
    _check(_slimpar("export", "--hf", str(run), str(tmp_path / "hf"), cwd=ROOT), "truncated")
    assert tree(tmp_path) == before
