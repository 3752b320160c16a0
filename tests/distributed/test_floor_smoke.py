"""The smoke subset that CI runs on the floor torch (``.ci/floor``, ``-m floor``): every ``parallel.mode`` trains
4 steps under slimpar's own launcher and under torchrun and exits 0, and a checkpointed run resumes where it
stopped under each. The README's snippets (tests/distributed/test_readme.py) are in the subset too.

These runs repeat, at the floor, what the default suite checks in depth on the installed torch; on that torch
they are left to ``-m slow``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, TINY, losses, run_train, stop_and_resume, summary

pytestmark = [pytest.mark.floor, pytest.mark.slow]

SHORT = ["--train.steps", "4", "--log.every", "1", "--eval.batches", "1", "--data.ood", "none",
         "--checkpoint.export", "false", "--log.progress", "false"]
PIPE = ["--parallel.mode", "pipeline", "--pipeline.stages", "2", "--pipeline.microbatches", "2"]
MODES = {  # name: (workers, overrides)
    "single": (1, ["--parallel.mode", "single"]),
    "ddp": (2, ["--parallel.mode", "ddp"]),
    "fsdp": (2, ["--parallel.mode", "fsdp"]),
    "sdp": (2, ["--parallel.mode", "sdp"]),
    "pipeline_mapl": (2, [*PIPE, "--pipeline.codec", "mapl"]),
    "hybrid": (4, [*PIPE, "--pipeline.dp", "sdp", "--pipeline.sdp_keep", "0.5", "--pipeline.codec", "mapl"]),
}


def _torchrun(out, workers: int, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(workers),
           "-m", "slimpar", "train", "--config", str(TINY), "--out", str(out), *overrides]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def _trained(out, workers: int, steps: int = 4) -> None:
    s = summary(out)
    assert s["world_size"] == workers and s["steps"] == steps
    assert len(losses(out)) == steps and all(v == v for v in losses(out))  # finite (NaN != NaN)


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_trains_under_slimpars_launcher(tmp_path, mode):
    workers, overrides = MODES[mode]
    run_train(tmp_path / mode, *SHORT, "--parallel.workers", str(workers), *overrides, timeout=300)
    _trained(tmp_path / mode, workers)


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_trains_under_torchrun(tmp_path, mode):
    workers, overrides = MODES[mode]
    _torchrun(tmp_path / mode, workers, *SHORT, *overrides)
    _trained(tmp_path / mode, workers)


def test_a_checkpointed_run_resumes_under_slimpars_launcher(tmp_path):
    run = [*SHORT, "--parallel.workers", "2", "--parallel.mode", "sdp", "--checkpoint.every", "2"]
    stop_and_resume(tmp_path / "run", run, run, stop_after=2, timeout=300)
    _trained(tmp_path / "run", 2)


def test_a_checkpointed_run_resumes_under_torchrun(tmp_path):
    out = tmp_path / "run"
    run = [*SHORT, "--parallel.mode", "ddp", "--checkpoint.every", "2"]
    _torchrun(out, 2, *run, "--train.stop_after", "2")
    assert len(losses(out)) == 2 and (out / "checkpoints" / "step_000002").is_dir()
    _torchrun(out, 2, *run, "--resume")
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # resumed at step 3, not started over
    _trained(out, 2)
