"""Preemptible and shared machines (issue 40): SIGTERM or SIGUSR1 saves the current step and exits 143, the resume is
bit-exact; a killed launcher (slimpar's or torchrun) leaves no worker behind, and its workers keep the run folder
locked until they have saved and exited; past ``checkpoint.on_signal_s`` a stop exits without the save and says so.

Each run: the tiny LLaMA, SDP on 2 workers (keep 0.5), one log line per step, no periodic checkpoint, so the only
checkpoint before the end is the one the stop writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, TINY, assert_same_run, background_run, losses

STEPS = 16
ARGS = ["--config", str(TINY), "--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.keep", "0.5",
        "--train.steps", str(STEPS), "--checkpoint.every", "0", "--eval.batches", "1", "--data.ood", "none"]
SLIMPAR = [sys.executable, "-m", "slimpar", "train"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "slimpar",
            "train"]


def _workers(launcher: int) -> dict[int, int]:
    """{pid: RANK} of the processes whose parent is ``launcher`` and whose environment names a rank."""
    out = {}
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == launcher:
                env = (d / "environ").read_bytes().split(b"\0")
                rank = next(v[5:] for v in env if v.startswith(b"RANK="))
                out[int(d.name)] = int(rank)
        except (OSError, StopIteration, ValueError, IndexError):
            continue
    return out


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(pid)
        except OSError:
            pass
    return out


def _steps(out: Path) -> list[int]:
    try:
        return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    except (OSError, ValueError, KeyError):
        return []


def _start(cmd: list[str], out: Path, tmp_path: Path, at_step: int = 4):
    """``cmd`` in the background once it has logged ``at_step`` steps: (its context, the process, {pid: rank})."""
    run = background_run(cmd, tmp_path)
    proc = run.__enter__()
    deadline = time.monotonic() + 200
    while len(_steps(out)) < at_step:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    workers = _workers(proc.pid)
    assert sorted(workers.values()) == [0, 1], workers
    return run, proc, workers


def _stopped_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]
    return lines[0]


def test_sigterm_saves_the_step_and_the_resume_is_bit_exact(tmp_path):
    """SIGTERM to slimpar's launcher only (a spot instance's notice): the agent forwards it, every rank finishes the
    step it is in, one checkpoint there, exit 143 with the signal, the step and the command; the same command then
    ends bit-exact with an uninterrupted run: every loss, the validation loss, every weight; no step lost or
    repeated."""
    out, ref = tmp_path / "run", tmp_path / "ref"
    cmd = [*SLIMPAR, *ARGS, "--out", str(out)]
    run, proc, workers = _start(cmd, out, tmp_path)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    run.__exit__(None, None, None)
    assert proc.returncode == 143, err[-3000:]
    step = len(_steps(out))
    assert 4 <= step < STEPS and _steps(out) == list(range(1, step + 1))
    line = _stopped_line(err)
    assert line.startswith(f"slimpar: stopped by SIGTERM: every rank finished step {step} and saved its checkpoint "
                           f"({out}/checkpoints/step_{step:06d})"), line
    assert line.endswith(f"to resume it: slimpar train {' '.join(ARGS)} --out {out}"), line
    assert (out / "checkpoints" / f"step_{step:06d}" / "trainer.json").is_file() and not _alive(workers)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT,
                           env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from step {step}" in again.stdout
    assert _steps(out) == list(range(1, STEPS + 1))  # each step once: none lost, none repeated
    straight = subprocess.run([*SLIMPAR, *ARGS, "--out", str(ref)], capture_output=True, text=True, timeout=240,
                              cwd=ROOT, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert_same_run(out, ref)
    assert len(losses(out)) == STEPS


def test_a_killed_launcher_leaves_no_worker_and_its_workers_hold_the_folder(tmp_path):
    """``kill -9`` of slimpar's launcher (here while its workers are stopped, so that they outlive it for a while):
    a second job on the same folder is refused, naming them; once they run they get their death signal, finish the
    step, save it and exit: no orphan, and nothing of the step lost."""
    out = tmp_path / "run"
    cmd = [*SLIMPAR, *ARGS, "--out", str(out)]
    run, proc, workers = _start(cmd, out, tmp_path)
    try:
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)  # not communicate: the stopped workers hold the pipes open
        step = len(_steps(out))
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                                env=dict(os.environ, PYTHONWARNINGS="ignore"))
        assert second.returncode == 2, second.stderr[-3000:]
        assert f"is in use by 2 worker(s) of an earlier slimpar train job whose launcher is gone (pids " \
               f"{' '.join(map(str, sorted(workers)))})" in second.stderr, second.stderr
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while _alive(workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(workers), f"orphaned workers {_alive(workers)} of {sorted(workers)}, {len(_steps(out))} steps"
    finally:
        for pid in _alive(workers):
            os.kill(pid, signal.SIGKILL)
        run.__exit__(None, None, None)
    saved = len(_steps(out))
    # step + 2 too: a worker stopped after it had sent step step+1's guard all-reduce (its stop flag 0 then, and
    # rank 0 not yet logging that step) takes the death signal into step step+2's (CI at 6afa9fc, once in four runs)
    saved_at = sorted(p.name for p in (out / "checkpoints").iterdir()) if (out / "checkpoints").is_dir() else []
    assert saved in (step, step + 1, step + 2), (step, saved, saved_at, _told(proc, out))
    assert (out / "checkpoints" / f"step_{saved:06d}" / "trainer.json").is_file(), (step, saved, saved_at,
                                                                                    _told(proc, out))


def _told(proc: subprocess.Popen, out: Path) -> str:
    """What a dead launcher's workers said (they wrote to its pipes) and rank 0's stop record, for a failure."""
    try:
        said = proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError):
        said = ("", "(unread)")
    record = (out / ".slimpar-stopped.json").read_text() if (out / ".slimpar-stopped.json").is_file() else "none"
    return f"record: {record}\nstdout: {said[0][-2000:]}\nstderr: {said[1][-4000:]}"


def test_past_the_grace_a_stop_exits_without_the_save_and_says_so(tmp_path):
    """Rank 1 stopped (SIGSTOP) when the launcher gets SIGTERM with checkpoint.on_signal_s = 2: rank 0 cannot agree
    on a step with it, its grace timer ends it with 143, and the line says that nothing was saved and from where
    the run resumes."""
    out = tmp_path / "run"
    run, proc, workers = _start([*SLIMPAR, *ARGS, "--out", str(out), "--checkpoint.on_signal_s", "2"], out, tmp_path)
    rank1 = next(pid for pid, rank in workers.items() if rank == 1)
    try:
        os.kill(rank1, signal.SIGSTOP)
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(4)
        os.kill(rank1, signal.SIGCONT)
        _, err = proc.communicate(timeout=120)
    finally:
        run.__exit__(None, None, None)
    assert proc.returncode == 143, err[-3000:]
    line = _stopped_line(err)
    assert line.startswith("slimpar: stopped by SIGTERM without a checkpoint: none was written within "
                           "checkpoint.on_signal_s = 2 s") and "it resumes from step 0 (no checkpoint)" in line, line
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())


@pytest.mark.slow
def test_sigusr1_to_every_process_stops_the_same_way(tmp_path):
    """SLURM's ``--signal=USR1`` reaches every process of the job step: the workers directly and again through the
    agent; they agree on one step and save it once."""
    out = tmp_path / "run"
    run, proc, workers = _start([*SLIMPAR, *ARGS, "--out", str(out)], out, tmp_path)
    for pid in [proc.pid, *workers]:
        os.kill(pid, signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    run.__exit__(None, None, None)
    step = len(_steps(out))
    assert proc.returncode == 143 and _stopped_line(err).startswith(
        f"slimpar: stopped by SIGUSR1: every rank finished step {step} and saved its checkpoint"), err[-3000:]
    assert [p.name for p in (out / "checkpoints").iterdir()] == [f"step_{step:06d}"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_torchrun_stopped_or_killed_leaves_no_worker_and_saves_the_step(sig, tmp_path):
    """Under torchrun: its SIGTERM is forwarded to the ranks; its SIGKILL reaches them as their death signal
    (SIGTERM). Either way every rank saves the step and exits; rank 0 names the torchrun command."""
    out = tmp_path / "run"
    run, proc, workers = _start([*TORCHRUN, *ARGS, "--out", str(out)], out, tmp_path)
    os.kill(proc.pid, getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    deadline = time.monotonic() + 60
    while _alive(workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    run.__exit__(None, None, None)
    assert not _alive(workers), "orphaned workers"
    step = len(_steps(out))
    assert f"slimpar: stopped by SIGTERM: every rank finished step {step} and saved its checkpoint" in err, err[-3000:]
    assert "to resume it: the same torchrun command" in err
    assert (out / "checkpoints" / f"step_{step:06d}" / "trainer.json").is_file()
