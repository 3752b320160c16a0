"""Fault injection (issue 11): SIGKILL a random worker at a random step; the job restarts by itself.

Two 4-process runs of the tiny LLaMA, 8 steps, a checkpoint every 2 steps, one restart allowed:

- SDP, 4 workers at keep 0.5, under ``torchrun --standalone --max-restarts 1`` (the restart path whose
  gloo start-up used to fail with "Connection refused": slimpar.train.launch.worker.init_attempt_group);
- a 4-stage MAPL pipeline under slimpar's own launcher, ``slimpar train --max-restarts 1``.

The victim (a seeded random worker) and the moment (a seeded random step, read from ``metrics.jsonl``)
are printed. Each run must exit 0 after a restart (new worker processes appear), and end bitwise equal
to an uninterrupted run of the same command: every loss in ``metrics.jsonl`` and the validation loss,
with steps 1..8 each logged exactly once. ``SLIMPAR_FAULT_SEED`` picks other victims and moments.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, TINY, losses, summary

SEED = int(os.environ.get("SLIMPAR_FAULT_SEED", "11"))
STEPS = 8
COMMON = ["--config", str(TINY), "--train.steps", str(STEPS), "--eval.batches", "1", "--data.ood", "none",
          "--checkpoint.export", "false", "--checkpoint.every", "2"]
SDP = ["--parallel.mode", "sdp", "--sdp.keep", "0.5"]
MAPL = ["--parallel.mode", "pipeline", "--parallel.workers", "4", "--pipeline.stages", "4",
        "--pipeline.microbatches", "4", "--pipeline.codec", "mapl", "--pipeline.rank", "16",
        "--model.tie_embeddings", "false"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
            "--max-restarts", "1", "-m", "slimpar", "train"]
SLIMPAR = [sys.executable, "-m", "slimpar", "train", "--max-restarts", "1"]
CASES = {"sdp_torchrun": (TORCHRUN, SDP), "mapl_pipeline": (SLIMPAR, MAPL)}


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(d.name))
    return tree


def _descendants(pid: int) -> list[int]:
    tree, out, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _workers(launcher: int) -> dict[int, str]:
    """The training processes under ``launcher``: ``{pid: rank}`` (torchrun passes RANK in the environment
    of each worker; slimpar's launcher spawns them and sets it afterwards, so there it is the pid order)."""
    pids = sorted(p for p in _descendants(launcher) if ("spawn_main" in _cmdline(p) or "slimpar" in _cmdline(p))
                  and "resource_tracker" not in _cmdline(p))
    found = {}
    for i, pid in enumerate(pids):
        try:
            env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().decode(
                errors="replace").split("\0") if "=" in kv)
        except OSError:
            env = {}
        found[pid] = f"rank {env['RANK']}" if "RANK" in env else f"worker #{i} by pid order"
    return found


def _last_step(out: Path) -> int:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = []
    for line in lines:
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            pass
    return max(steps, default=0)


def _run(cmd: list[str], out: Path, kill_at: int | None, rng: random.Random | None, timeout: float = 240) -> dict:
    """Run ``cmd``; with ``kill_at``, SIGKILL one random worker once step ``kill_at`` is in metrics.jsonl."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.Popen([*cmd, "--out", str(out)], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    report: dict = {"killed": None, "restarted": False}
    try:
        deadline = time.monotonic() + timeout
        before: set[int] = set()
        while proc.poll() is None and time.monotonic() < deadline:
            workers = _workers(proc.pid)
            if report["killed"] and set(workers) - before:
                report["restarted"] = True  # workers the agent started after the kill
            if kill_at is not None and report["killed"] is None and len(workers) == 4 and _last_step(out) >= kill_at:
                pid = rng.choice(sorted(workers))
                os.kill(pid, signal.SIGKILL)
                report["killed"] = (workers[pid], pid, _last_step(out))
                before = set(workers)
                print(f"{out.name}: SIGKILL {workers[pid]} (pid {pid}) with step {report['killed'][2]} logged "
                      f"(chosen step {kill_at}, seed {SEED})", flush=True)
            time.sleep(0.05)
        if proc.poll() is None:
            pytest.fail(f"{cmd} did not finish in {timeout} s:\n{log.read_text()[-4000:]}")
    finally:
        for pid in [*_descendants(proc.pid), proc.pid]:  # only this run's own processes, by id
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    report["returncode"], report["log"] = proc.returncode, log.read_text()
    return report


# the pipeline case (slimpar's own launcher) runs with -m slow; SDP under torchrun runs by default
@pytest.mark.parametrize("case", ["sdp_torchrun", pytest.param("mapl_pipeline", marks=pytest.mark.slow)])
def test_killed_worker_restarts_and_resumes_bitwise(case, tmp_path):
    launcher, mode = CASES[case]
    cmd = [*launcher, *COMMON, *mode]
    rng = random.Random(f"{SEED}-{case}")
    kill_at = rng.randint(3, STEPS - 2)
    faulty = _run(cmd, tmp_path / "faulty", kill_at, rng)
    assert faulty["returncode"] == 0, faulty["log"][-6000:]
    assert faulty["killed"] is not None, f"the run ended before step {kill_at} was logged"
    assert faulty["restarted"], "no new workers were started after the kill"
    straight = _run(cmd, tmp_path / "straight", None, None)
    assert straight["returncode"] == 0, straight["log"][-6000:]
    steps = [json.loads(line)["step"] for line in (tmp_path / "faulty" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))  # nothing lost, nothing twice
    assert losses(tmp_path / "faulty") == losses(tmp_path / "straight")  # bitwise: == on floats
    assert summary(tmp_path / "faulty")["val_loss"] == summary(tmp_path / "straight")["val_loss"]
    kept = sorted(p.name for p in (tmp_path / "faulty" / "checkpoints").iterdir())
    assert kept == ["step_000006", f"step_{STEPS:06d}"], kept  # checkpoint.keep_last = 2 pruned the rest
    print(f"{case}: killed {faulty['killed'][0]} at step {faulty['killed'][2]}, 1 restart, "
          f"{STEPS} losses and val_loss bitwise equal")
