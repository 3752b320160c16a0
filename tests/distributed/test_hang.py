"""No hangs: a stopped (SIGSTOP) worker ends a 2-worker DDP run within 2x parallel.timeout_s, loudly.

Without a timeout the other worker would wait in its gradient all-reduce forever (gloo's default is 30
minutes). The launcher must exit non-zero with a message that names the timeout and the option.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import ROOT, TINY

TIMEOUT_S = 10
START_SLACK_S = 120  # launching 2 workers, building data and the model on 2 shared cores
STOP_SLACK_S = 30  # only for the diagnostic wait; the assertion itself is 2x the timeout


def _children(pid: int) -> list[int]:
    """Direct children of ``pid``, read from /proc (psutil is not a dependency)."""
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # field 4: ppid (after the "(comm)" field)
            kids.append(int(entry.name))
    return kids


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for kid in _children(todo.pop()):
            out.append(kid)
            todo.append(kid)
    return out


def _workers(launcher: int) -> list[int]:
    """The training workers (``python -m slimpar.train.launch.worker_entry``), not other helper processes."""
    found = []
    for pid in _descendants(launcher):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"slimpar.train.launch.worker_entry" in cmd:  # how slimpar's launcher starts each worker
            found.append(pid)
    return sorted(found)


def _wait_for_a_step(out: Path, proc: subprocess.Popen, deadline: float) -> None:
    metrics = out / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and metrics.read_text().strip():
            return
        assert proc.poll() is None, f"the run ended early ({proc.returncode})"
        time.sleep(0.2)
    raise AssertionError("no step was logged before the start-up deadline")


def test_stopped_worker_ends_the_run_with_a_named_timeout(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "slimpar", "train", "--config", str(TINY), "--out", str(out),
           "--parallel.mode", "ddp", "--parallel.workers", "2", "--parallel.timeout_s", str(TIMEOUT_S),
           "--train.steps", "200", "--eval.batches", "1", "--data.ood", "none"]
    log = tmp_path / "stderr.txt"
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT,
                                env=dict(os.environ, PYTHONWARNINGS="ignore"), start_new_session=True)
    everyone: set[int] = set()
    try:
        _wait_for_a_step(out, proc, time.monotonic() + START_SLACK_S)
        workers = _workers(proc.pid)
        assert len(workers) == 2, workers
        everyone.update(workers)
        os.kill(workers[-1], signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            code = proc.wait(timeout=2 * TIMEOUT_S + STOP_SLACK_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {2 * TIMEOUT_S + STOP_SLACK_S} s after SIGSTOP:\n"
                                 f"{log.read_text()[-3000:]}") from None
        took = time.monotonic() - stopped_at
        text = log.read_text()
        print(f"time to error after SIGSTOP: {took:.1f} s (timeout {TIMEOUT_S} s)")
        assert code != 0, text[-3000:]
        assert took < 2 * TIMEOUT_S, (f"the run ended {took:.1f} s after SIGSTOP, not within 2x {TIMEOUT_S} s:\n"
                                      f"{text[-3000:]}")
        assert "parallel.timeout_s" in text and f"{TIMEOUT_S} s" in text, text[-3000:]
        assert "gave up after waiting" in text, text[-3000:]
    finally:
        everyone.update(_descendants(proc.pid) if proc.poll() is None else [])
        for pid in everyone | ({proc.pid} if proc.poll() is None else set()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)
