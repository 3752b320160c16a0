"""Run benchmark rows as real ``slimpar train`` jobs, one at a time, and collect their summaries.

Each row is a fresh ``python -m slimpar train`` process tree (the same path a user runs), so rows
cannot leak state into each other. A row whose ``summary.json`` already exists is reused, which makes
an interrupted benchmark resumable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # the named runs ship inside the package


@dataclass
class Row:
    name: str
    config: str
    overrides: list[str] = field(default_factory=list)
    group: str = ""  # rows compared against the same baseline share a group (e.g. "llama", "resnet")
    seed: int = 0
    tags: dict = field(default_factory=dict)
    timing_round: int = 0  # > 0: a short rerun that only times steps (bench/timing.py)
    timing_steps: int = 0  # steps of its timing reruns; 0 = bench/timing.py's TIMING_STEPS
    env: dict = field(default_factory=dict)  # environment variables of its run (e.g. OMP_NUM_THREADS)

    @property
    def key(self) -> str:
        key = f"{self.group}-{self.name}-s{self.seed}" + (f"-t{self.timing_round}" if self.timing_round else "")
        return key.replace(" ", "_").replace("/", "_").replace("+", "_")


def run_row(row: Row, root: Path, timeout: int = 3600) -> dict:
    """Train one row (or reuse its finished run) and return its summary plus its loss curve."""
    out = root / "runs" / row.key
    summary_path = out / "summary.json"
    if not summary_path.exists():
        config = str(CONFIGS / Path(row.config).name)
        cmd = [sys.executable, "-m", "slimpar", "train", "--config", config, "--out", str(out),
               "--log.progress", "false", "--train.seed", str(row.seed), *row.overrides]
        resumed = (out / "checkpoints").exists()  # an interrupted run resumes; its time is partial
        load_before = os.getloadavg()[0]  # how busy the machine was at the start
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, PYTHONWARNINGS="ignore", **row.env))
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
