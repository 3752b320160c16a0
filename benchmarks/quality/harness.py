"""``slimpar bench quality``: the long-regime quality benchmark, 3 seeds per row, in one process per run.

Every run is a real ``slimpar train`` job with one process and one thread, so two runs share a 2-core
machine side by side: SDP rows are virtual SDP (``--sdp.virtual true``, 4 simulated workers; equal to 4
processes, tests/unit/test_sdp_virtual.py) and pipeline rows are virtual pipelines (4 stages in one
process). Memory and bytes are not measured here (``bench sdp`` and ``bench mapl`` do that with real
processes); this benchmark measures loss only.

The groups and their rows are in benchmarks/quality/rows.py.

Rows are resumable three times over: a finished row's ``summary.json`` is reused; a run the ``results.json`` under
``--out`` recorded is reused where its folder is gone and its command is the same (commit that file, copy it into a
new machine's ``--out``, and the benchmark goes on from there: run folders are not committed); and an interrupted
run resumes from its last checkpoint (every 500 steps). ``results.json`` keeps every run it recorded: one call with
``--rows X`` replaces X's runs and keeps the others, so the report covers every finished run. The report, the JSON
and the plots are rewritten after every finished run, so an interrupted benchmark still leaves a report of what
finished. Stop it with Ctrl-C (or ``kill -- -PGID``): its runs are child processes, and ``kill PID`` ends the
benchmark alone, its runs training on; a benchmark restarted meanwhile then fails those rows with the run folder's
lock message (train/launch/run_lock.py) instead of training them twice.
"""

from __future__ import annotations

import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.quality.plots import plots
from benchmarks.quality.report import aggregate, report_markdown, targets
from benchmarks.quality.rows import (
    ALIASES,
    CORE,
    GROUPS,
    OPT_IN,
    STEPS,
    SWEEPS,
    best_rates,
    quick_rows,
    recorded_runs,
    rows,
)
from benchmarks.report import metadata, run_commits, write_json
from benchmarks.runner import Row, row_command, run_row, select_rows
from slimpar.train.launch.run_lock import LOCK


def bench_quality(out: Path, quick: bool, only: set[str] | None = None, jobs: int = 2,
                  steps: int = STEPS, report_only: bool = False) -> dict:
    """Run (or reuse) every selected run (``only``: the ``--rows`` names; none: the core set, ``CORE``), ``jobs``
    at a time, rewriting the report after each one. A tuned group runs after the others, once its sweep has given
    each row its rate.

    ``report_only`` trains nothing: the report covers the finished runs (their folders, or where a folder is
    gone, the run as the committed results.json recorded it) and lists the others as not run."""
    recorded = _recorded_runs(out)
    only = _expand(only) or (None if quick else set(CORE))
    opt_in = tuple(g for g in OPT_IN if any(o == g or o.startswith(f"{g}/") for o in only or ()))
    _check_sweeps(out, opt_in)
    first, later_only = _split_tuned(only)
    groups = tuple(g for g in GROUPS + opt_in if g not in TUNED_GROUPS)
    todo = [] if only and not first else select_rows(quick_rows() if quick else rows(steps, groups=groups), first)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per run: ``jobs`` runs share the cores
    results: dict[str, dict] = {}
    failed: list[str] = []
    meta = metadata({"quick": quick, "jobs": jobs, "steps": steps})
    phases = [tuple(g for g in opt_in if g in phase) for phase in PHASES]
    if report_only:
        for phase in phases:
            todo += _new(todo, _tuned_rows(out, steps, tuple(g for g in phase if _swept(out, g)), later_only))
        results = {r.key: done for r in todo if (done := _finished(r, out, recorded, same_command=False))}
        return _write(out, todo, results, failed, meta, recorded)
    _run(out, todo, todo, results, failed, meta, jobs, recorded)
    for phase in (p for p in phases if p):  # the sweeps have finished: each row's rate is known now
        _check_sweeps(out, phase, ran=True)
        later = _new(todo, _tuned_rows(out, steps, phase, later_only))
        _reuse_sweep_runs(out, later)
        todo += later
        _run(out, later, todo, results, failed, meta, jobs, recorded)
    data = _write(out, todo, results, failed, meta, recorded)
    if failed:
        raise RuntimeError(f"{len(failed)} benchmark runs failed: {'; '.join(failed)}")
    return data


# a hung run's limit: the longest run, FLOP-matched B-SDP 0.5 at 32,000 steps (64,000 batched virtual SDP steps),
# takes about 1.2 h at 2 at a time beside nothing else (26 minutes at 12,500 steps); the limit leaves room for a
# busy machine and for a row whose simulated workers run one after another (--sdp.virtual_batched false, slower)
RUN_TIMEOUT_S = 12 * 3600
CURVE_POINTS = 256  # training-loss points a run's curve keeps in results.json (thin)

# the groups that run at the sweeps' rates, in phases after the sweeps: the tuned groups, then the length and
# width sweeps (whose shortest or d = 128 runs are the tuned groups' runs), then the third seeds at the longest
# length that the first two leave unresolved (quality_rows.third_seed)
PHASES = (tuple(t for t, _ in SWEEPS.values()), ("length", "width"), ("length",))
TUNED_GROUPS = tuple(g for phase in PHASES for g in phase)
NEEDS = {"tuned": ("lr-sweep",), "sdp-tuned": ("sdp-lr-sweep",), "length": tuple(SWEEPS), "width": ("lr-sweep",)}


def _new(todo: list[Row], rows: list[Row]) -> list[Row]:
    """``rows`` not in ``todo`` (a later phase lists the runs of the one before again)."""
    have = {r.key for r in todo}
    return [r for r in rows if r.key not in have]


def _expand(only: set[str] | None) -> set[str]:
    """``--rows`` with its aliases (``one-rate``) replaced by the groups they name."""
    if not only:
        return set()
    return set().union(*({r.group for r in rows(groups=ALIASES[o])} if o in ALIASES else {o} for o in only))


def _split_tuned(only: set[str] | None) -> tuple[set[str] | None, set[str]]:
    """``--rows`` split into what selects runs of the first phase and what selects tuned runs."""
    if not only:
        return only, set()
    tuned = {o for o in only if o.split("/")[0] in TUNED_GROUPS}
    return only - tuned, tuned


def _check_sweeps(out: Path, groups: tuple[str, ...], ran: bool = False) -> None:
    """A group that runs at the sweeps' rates needs its sweeps finished under ``out``, or selected to run first
    (``ran``: they have run)."""
    from slimpar.config import ConfigError

    for group in (g for g in groups if g in NEEDS):
        for sweep in NEEDS[group]:
            named = SWEEPS[sweep][1]
            if (ran or sweep not in groups) and len(best_rates(out, sweep)) < len(named):
                raise ConfigError(f"the {group!r} rows take each row's best learning rate from the {sweep!r} group, "
                                  f"whose runs have not all finished under {out} (rows with a full sweep: "
                                  f"{sorted(best_rates(out, sweep))}); run --rows {sweep} to the end first, or "
                                  f"both: --rows {sweep},{group}")


def _swept(out: Path, group: str) -> bool:
    """Whether every sweep ``group`` takes its rates from has finished under ``out``."""
    return all(len(best_rates(out, sweep)) == len(SWEEPS[sweep][1]) for sweep in NEEDS[group])


def _tuned_rows(out: Path, steps: int, tuned: tuple[str, ...], only: set[str]) -> list[Row]:
    if not tuned:
        return []
    mine = {o for o in only if o.split("/")[0] in tuned}
    return select_rows([r for r in rows(steps, groups=tuned, sweep_dir=out) if r.group in tuned], mine)


def _run(out: Path, batch: list[Row], todo: list[Row], results: dict, failed: list[str], meta: dict,
         jobs: int, recorded: dict[str, dict]) -> None:
    """Run ``batch``'s rows ``jobs`` at a time, rewriting the report of all of ``todo`` after each. The finished
    ones (_finished) are collected first and the report written once for them: rewriting it (an 8 MB record and
    its plots) after each of a hundred finished runs kept a resumed sweep from starting for minutes."""
    if not batch:
        return
    for row in batch:
        if done := _finished(row, out, recorded, same_command=True):
            results[row.key] = done
    left = [r for r in batch if r.key not in results]
    _write(out, todo, results, failed, meta, recorded)
    lock = threading.Lock()

    def one(row: Row) -> None:
        try:
            result = thin(run_row(row, out, timeout=RUN_TIMEOUT_S))
        except Exception as e:  # noqa: BLE001 - a failed run is reported, the others go on
            with lock:
                failed.append(f"{row.key} ({str(e).splitlines()[0]})")
                bar.console.print(f"failed: {row.key}")
        else:
            with lock:
                results[row.key] = result
                bar.console.print(f"finished: {row.key} (val_loss {result['summary'].get('val_loss')})")
        with lock:
            _write(out, todo, results, failed, meta, recorded)

    from rich.progress import Progress

    with Progress() as bar, ThreadPoolExecutor(jobs) as pool:
        task = bar.add_task(f"bench quality ({len(left)} runs to train, {len(batch) - len(left)} finished, "
                            f"{jobs} at a time)", total=len(left))
        for _ in pool.map(lambda r: (one(r), bar.advance(task)), left):
            pass


def _reuse_sweep_runs(out: Path, todo: list[Row]) -> None:
    """A run whose command an earlier group's run already ran (``tags["same_as"]``): link that run's files."""
    for r in todo:
        if "same_as" in r.tags and not (out / "runs" / r.key).exists():
            src = out / "runs" / r.tags["same_as"]
            if (src / "summary.json").exists():
                # hard links, not the lock: each folder keeps a lock of its own (train/launch/run_lock.py)
                shutil.copytree(src, out / "runs" / r.key, copy_function=os.link, ignore=shutil.ignore_patterns(LOCK))


def _recorded_runs(out: Path) -> dict[str, dict]:
    """The runs the results.json under ``out`` holds, by run key."""
    return {Row(r["row"], "", group=r["group"], seed=r["seed"], timing_round=r.get("timing_round", 0)).key: r
            for r in recorded_runs(out)}


def _finished(row: Row, out: Path, recorded: dict[str, dict], same_command: bool) -> dict | None:
    """``row``'s finished run: from its folder; where that is gone, as results.json recorded it, or the earlier
    group's run it repeats (``tags["same_as"]``); ``same_command``: only a record of ``row``'s own command (before
    training: a row whose command changed trains anew). None: not finished."""
    if (out / "runs" / row.key / "summary.json").exists():
        return thin(run_row(row, out))
    if (mine := recorded.get(row.key)) and (not same_command or mine["command"] == row_command(row)):
        return mine
    same = recorded.get(row.tags.get("same_as", ""))
    if same and (not same_command or same["command"] == row_command(row)):
        return {**same, "row": row.name, "group": row.group, "seed": row.seed, "tags": row.tags,
                "command": row_command(row)}
    return None


def thin(run: dict, most: int = CURVE_POINTS) -> dict:
    """``run`` with at most ``most`` training-loss points in its curve, evenly strided, plus every evaluation and
    the last point: results.json is committed, and a 32,000-step run logs 1,280 points. The report reads the same
    thinned curve from a folder or from the record."""
    curve = run["curve"]
    stride = -(-len(curve) // most)
    if stride <= 1:
        return run
    kept = [c for i, c in enumerate(curve) if i % stride == stride - 1 or i == len(curve) - 1
            or any(k.startswith("val_") for k in c)]
    return {**run, "curve": kept}


def _write(out: Path, todo: list[Row], results: dict[str, dict], failed: list[str], meta: dict,
           recorded: dict[str, dict]) -> dict:
    """Rewrite results.json, report.md and the plots: ``todo``'s finished runs and every recorded run outside
    ``todo`` (kept, so that one group's call loses no other group's record)."""
    mine = {r.key for r in todo}
    done = [r for k, r in recorded.items() if k not in mine] + [results[r.key] for r in todo if r.key in results]
    meta["run_commits"] = run_commits(done)
    lines = aggregate(done)
    failed_keys = {f.split(" ")[0] for f in failed}
    pending = [r.key for r in todo if r.key not in results and r.key not in failed_keys]
    data = {"meta": meta, "lines": lines, "targets": targets(lines), "pending": pending, "failed": failed,
            "runs": done}
    write_json(out / "results.json", data)
    (out / "report.md").write_text(report_markdown(lines, meta, pending, failed, done))
    if done:
        plots(done, lines, out)
    return data
