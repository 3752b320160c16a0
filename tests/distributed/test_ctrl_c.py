"""Ctrl-C on a multi-worker run ends with one line naming the run folder and the command that resumes it, not
the elastic agent's log lines and each worker's KeyboardInterrupt traceback (slimpar/cli.py, train/launch/worker.py)."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from tests.helpers import background_run


def test_ctrl_c_ends_a_ddp_run_with_one_line(tmp_path):
    cmd = [sys.executable, "-m", "slimpar", "train", "--config", "llama_tiny", "--parallel.mode", "ddp",
           "--parallel.workers", "2", "--train.steps", "100000", "--data.ood", "none", "--log.progress", "true",
           "--checkpoint.every", "0"]
    with background_run(cmd, tmp_path) as proc:
        for line in proc.stdout:  # non-TTY progress: one line per logged step once the workers train
            if line.startswith("step "):
                break
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("slimpar: interrupted; the run folder is runs/llama_tiny; to resume it: slimpar train")


@pytest.mark.parametrize("moment", ["launcher importing", "workers importing"])
def test_ctrl_c_during_start_up_ends_with_one_line(tmp_path, moment):
    """Before the workers train: while the launcher imports torch (0.3 s in), and while the workers it has just
    started import torch (1 s after the run folder is printed; they need several seconds). Either way no
    traceback: the launcher's handler covers its imports (cli.py, lazy ``slimpar/__init__``), a worker's start-up
    handler is its first statement (train/launch/worker_entry.py)."""
    cmd = [sys.executable, "-m", "slimpar", "train", "--config", "llama_tiny", "--parallel.mode", "ddp",
           "--parallel.workers", "2", "--train.steps", "100000", "--data.ood", "none", "--checkpoint.every", "0"]
    with background_run(cmd, tmp_path) as proc:
        if moment == "launcher importing":
            time.sleep(0.3)
        else:
            assert proc.stdout.readline().startswith("run folder: ")
            time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("slimpar: interrupted"), err[-3000:]
    assert "Traceback" not in out + err
