"""Every failure ends with slimpar's own paragraph and a non-zero exit, no traceback and no launcher log lines
(issue 22, item 3), and ``--max-restarts`` does not restart a failure that would recur (train/failure.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from slimpar.train.failure import MARKER
from tests.helpers import ROOT, TINY, background_run, run_train

SHORT = ["--eval.batches", "1", "--data.ood", "none"]
DIVERGE = ["--train.steps", "10", "--train.warmup_steps", "1", "--train.lr", "1e6", "--train.grad_clip", "0"]
LAUNCHER_NOISE = ("Traceback", "ChildFailedError", "exitcode", "closing signal", "[rank")


def _clean(stderr: str) -> list[str]:
    for noise in LAUNCHER_NOISE:
        assert noise not in stderr, stderr[-4000:]
    return [line for line in stderr.splitlines() if line.strip()]


def _listening(pids: set[int]) -> list[str]:
    """Local addresses of the TCP sockets these processes listen on (``ss``)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if any(f"pid={p}," in line for p in pids)]


def test_nan_guard_is_not_restarted_by_slimpars_launcher(tmp_path):
    out = tmp_path / "run"
    proc = run_train(out, *SHORT, *DIVERGE, "--parallel.mode", "ddp", "--parallel.workers", "2",
                     "--parallel.max_restarts", "2", check=False, timeout=300)
    assert proc.returncode == 1
    lines = _clean(proc.stderr)
    assert len(lines) == 3, lines
    assert lines[0].startswith("slimpar: error: training diverged at step"), lines
    assert lines[1] == "slimpar: not restarted (--max-restarts): the NaN guard would stop every restart the same way"
    assert re.match(r"slimpar: training failed \(rank [01] exited with code 1\)", lines[2]), lines
    assert (out / MARKER).is_file()
    again = run_train(out, *SHORT, "--train.steps", "2", "--parallel.mode", "ddp", "--parallel.workers", "2",
                      "--allow-change", check=False, timeout=300)  # the user fixed the lr: a new start runs
    assert again.returncode == 0, again.stderr[-3000:]
    assert not (out / MARKER).exists()


def test_nan_guard_under_torchrun_restarts_end_at_once(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--max-restarts",
           "1", "-m", "slimpar", "train", "--config", str(TINY), "--out", str(out), "--parallel.mode", "ddp",
           *SHORT, *DIVERGE]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode != 0
    # torchrun's agent restarts regardless; the restarted workers end before training, saying why
    assert proc.stderr.count("training diverged at step") == 2, proc.stderr[-4000:]  # first attempt, then the note
    assert proc.stderr.count("not restarted (--max-restarts): the NaN guard") == 1, proc.stderr[-4000:]
    assert proc.stdout.count("update skipped") == 0


def test_full_disk_ends_clean_and_leaves_no_partial_checkpoint(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    # 1.5 MB: the config, tokenizer and metrics fit, the first checkpoint's shards (about 2.6 MB) do not
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1500k", "tmpfs", str(disk)], check=True)
    try:
        out = disk / "run"
        proc = run_train(out, *SHORT, "--train.steps", "4", "--checkpoint.every", "2", "--parallel.mode", "ddp",
                         "--parallel.workers", "2", "--parallel.max_restarts", "1", check=False, timeout=300)
        assert proc.returncode == 1
        lines = _clean(proc.stderr)
        assert lines[0].startswith("slimpar: error: the disk is full (No space left on device"), lines
        assert lines[1] == ("slimpar: not restarted (--max-restarts): the full disk would stop every restart the "
                            "same way")
        assert lines[2].startswith("slimpar: training failed"), lines
        assert list((out / "checkpoints").iterdir()) == []  # the partial step folder was removed
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_lost_worker_is_one_paragraph_and_names_the_rank(tmp_path):
    """Also: a one-host job listens on the loopback only (the agent's stores and gloo)."""
    cmd = [sys.executable, "-m", "slimpar", "train", "--config", str(TINY), "--parallel.mode", "ddp",
           "--parallel.workers", "2", "--train.steps", "100000", "--data.ood", "none", "--checkpoint.every", "0",
           "--log.progress", "true", "--out", str(tmp_path / "run")]
    with background_run(cmd, tmp_path) as proc:
        for line in proc.stdout:
            if line.startswith("step 3/"):
                break
        kids = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "slimpar.train.worker_entry"],
                              capture_output=True, text=True).stdout.split()
        victim = max(int(k) for k in kids)
        listening = _listening({proc.pid, *map(int, kids)})
        assert listening and all(addr.startswith("127.0.0.1:") for addr in listening), listening  # local_rdzv.py
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=200)
    assert proc.returncode == 1
    lines = _clean(err)
    assert any("lost a peer" in ln for ln in lines), lines
    assert lines[-1].startswith("slimpar: training failed (rank 1 was killed by SIGKILL)"), lines
