"""Run benchmark rows as real ``slimpar train`` jobs, one at a time, and collect their summaries.

Each row is a fresh ``python -m slimpar train`` process tree (the same path a user runs), so rows
cannot leak state into each other. A row whose ``summary.json`` already exists is reused, which makes
an interrupted benchmark resumable. A benchmark stopped on its own (``kill PID``) stops its jobs too
(:func:`stop_jobs_with_me`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from slimpar.config import CONFIG_DIR

CONFIGS = CONFIG_DIR  # the named runs ship inside the package


@dataclass
class Row:
    name: str
    config: str
    overrides: list[str] = field(default_factory=list)
    group: str = ""  # rows compared against the same baseline share a group (e.g. "llama", "resnet")
    seed: int = 0
    tags: dict = field(default_factory=dict)
    timing_round: int = 0  # > 0: a short rerun that only times steps (benchmarks/timing.py)
    timing_steps: int = 0  # steps of its timing reruns; 0 = benchmarks/timing.py's TIMING_STEPS
    env: dict = field(default_factory=dict)  # environment variables of its run (e.g. OMP_NUM_THREADS)

    @property
    def key(self) -> str:
        key = f"{self.group}-{self.name}-s{self.seed}" + (f"-t{self.timing_round}" if self.timing_round else "")
        return key.replace(" ", "_").replace("/", "_").replace("+", "_")


def run_row(row: Row, root: Path, timeout: int = 3600, checkout: Path | None = None) -> dict:
    """Train one row (or reuse its finished run) and return its summary plus its loss curve. ``checkout``: a
    checkout of another commit (a git worktree) whose slimpar and configs train it, run from there."""
    out = root / "runs" / row.key
    summary_path = out / "summary.json"
    if not summary_path.exists():
        config = str((checkout / "slimpar" / "configs" if checkout else CONFIGS) / Path(row.config).name)
        cmd = [sys.executable, "-m", "slimpar", "train", "--config", config, "--out", str(out),
               "--log.progress", "false", "--train.seed", str(row.seed), *row.overrides]
        resumed = (out / "checkpoints").exists()  # an interrupted run resumes; its time is partial
        load_before = os.getloadavg()[0]  # how busy the machine was at the start
        t0 = time.perf_counter()
        path = {"PYTHONPATH": str(checkout)} if checkout else {}  # the checkout's slimpar, not this one
        env = dict(os.environ, PYTHONWARNINGS="ignore", **row.env, **path)
        proc = _run_job(cmd, timeout, env=env, cwd=checkout)
        if proc.returncode != 0:
            out.mkdir(parents=True, exist_ok=True)
            (out / "failed.log").write_text(proc.stdout[-20000:] + "\n" + proc.stderr[-20000:])
            raise RuntimeError(f"benchmark row {row.key} failed:\n{' '.join(cmd)}\n{proc.stderr[-4000:]}")
        name = "resumed_wall_seconds.txt" if resumed else "wall_seconds.txt"
        (out / name).write_text(f"{time.perf_counter() - t0:.1f}\n")
        (out / "load_1m.txt").write_text(f"{load_before:.2f}\n")
    summary = json.loads(summary_path.read_text())
    wall = out / "wall_seconds.txt"  # absent for a reused run timed by nothing, or a resumed one
    load = out / "load_1m.txt"
    curve = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"row": row.name, "group": row.group, "seed": row.seed, "tags": row.tags, "command": row_command(row),
            "summary": {k: v for k, v in summary.items() if k != "config"}, "curve": curve,
            "wall_s": float(wall.read_text()) if wall.exists() else None,
            "load_1m": float(load.read_text()) if load.exists() else None, "timing_round": row.timing_round}


class Stopped(BaseException):
    """The benchmark was told to stop while this job ran: not a failure of its row (nothing is recorded; the run
    resumes from its checkpoints on the next call). A BaseException, so that ``except Exception`` passes it on."""


_LIVE: set[subprocess.Popen] = set()  # the jobs this process waits for, which stop_jobs_with_me stops with it
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


def _run_job(cmd: list[str], timeout: float, env: dict, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)``, with the job registered while it runs so that a
    stop sent to the benchmark reaches it (rows run in threads, and a signal reaches only the main one)."""
    if _STOPPING.is_set():  # a row queued behind the stopped ones: start nothing
        raise Stopped(" ".join(cmd))
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd) as proc:
        with _LIVE_LOCK:
            _LIVE.add(proc)
            if _STOPPING.is_set():  # started as the stop came
                proc.terminate()
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except BaseException:  # the timeout, or this thread going down
            proc.kill()
            proc.wait()
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)
    if _STOPPING.is_set():
        raise Stopped(" ".join(cmd))
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@contextlib.contextmanager
def stop_jobs_with_me() -> Iterator[None]:
    """While the block runs, SIGTERM or SIGHUP sent to the benchmark alone (``kill PID``, a closed terminal) stops
    its running ``slimpar train`` jobs too, with SIGTERM, and the benchmark exits 128 + the signal. Without it the
    jobs trained on, orphaned, holding their run folders' locks, so that a restarted benchmark failed on them.
    (Ctrl-C and ``kill -- -PGID`` reach the jobs already: they share the benchmark's process group.) Only the
    main thread may install signal handlers; elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        with _LIVE_LOCK:
            _STOPPING.set()
            jobs = list(_LIVE)
            for job in jobs:
                job.terminate()
        print(f"\nslimpar bench: stopped by {signal.Signals(signum).name}; stopped its {len(jobs)} running train "
              f"job(s) too. The same command resumes them from their checkpoints.", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    _STOPPING.clear()
    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def row_command(row: Row) -> str:
    """The command line a user types to run ``row`` (recorded with its run; a recorded run is reused only for the
    same command)."""
    env = [f"{k}={v}" for k, v in row.env.items()]
    return " ".join([*env, "slimpar train --config", row.config, "--train.seed", str(row.seed), *row.overrides])


def run_rows(rows: list[Row], root: Path, jobs: int = 1) -> list[dict]:
    """Every row, in order; ``jobs`` > 1 runs that many at once (GPU rows, whose timings are not compared
    across machines; CPU rows share 2 cores and need ``jobs = 1`` for honest step times)."""
    from concurrent.futures import ThreadPoolExecutor

    from rich.progress import Progress

    with Progress() as bar:
        task = bar.add_task("bench", total=len(rows))

        def one(row: Row) -> dict:
            if jobs == 1:
                bar.update(task, description=f"{row.group}: {row.name} (seed {row.seed})")
            result = run_row(row, root)
            bar.advance(task)
            return result

        if jobs == 1:
            return [one(row) for row in rows]
        with ThreadPoolExecutor(jobs) as pool:  # each row is its own subprocess; threads only wait
            return list(pool.map(one, rows))


def select_rows(rows: list[Row], only: set[str] | None) -> list[Row]:
    """Rows named in ``only`` as ``group``, ``name``, ``group/name`` or ``group/name/sSEED`` (all when empty)."""
    if not only:
        return rows

    def names(r: Row) -> set[str]:
        return {r.group, r.name, f"{r.group}/{r.name}", f"{r.group}/{r.name}/s{r.seed}"}

    unknown = only - set().union(*(names(r) for r in rows))
    if unknown:
        from slimpar.config import ConfigError  # the CLI prints it and exits 2, before anything is written

        groups, names_ = sorted({r.group for r in rows}), sorted({r.name for r in rows})
        raise ConfigError(f"unknown benchmark rows {sorted(unknown)}; select a group, a row or one seed's run "
                          f"('llama', 'DDP', 'llama/DDP' or 'llama/DDP/s0'); groups: {groups}; rows: {names_}")
    return [r for r in rows if names(r) & only]
