"""Step-time ratios measured side by side: every row again in more rounds, rows interleaved.

One benchmark run gives each row one step time, taken minutes apart from its baseline's; on a shared
2-core machine the load in between moves it by tens of percent. So after the rows' own runs (round 0),
:func:`timing_rounds` runs every row again ``rounds`` times, a short run each (``TIMING_STEPS`` steps, a
token evaluation, no export), one round after another and the rows in a different order each round
(rotated by one), so that a slow stretch of the machine falls on different rows. A row's step time over a
round is the run's median step after warm-up; :func:`step_time_ratios` divides it by the baseline's of
the same round and reports the median and range of those ratios over the rounds, plus the 1-minute load
average before each run.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from benchmarks.runner import Row, run_rows

TIMING_STEPS = 6  # the median of steps 3-5: after 2 warm-up steps, the instrumented step 2 left out


def timing_only(steps: int = TIMING_STEPS) -> list[str]:
    """The overrides of a timing rerun: ``steps`` steps, a token evaluation, nothing exported."""
    return ["--train.steps", str(steps), "--eval.batches", "1", "--data.ood", "none",
            "--checkpoint.export", "false", "--checkpoint.final", "false"]


def rotated(items: list, k: int) -> list:
    """``items`` in round ``k``'s order: rotated left by k, so that a slow stretch falls on other rows each round."""
    shift = k % len(items) if items else 0
    return items[shift:] + items[:shift]


def timing_rows(rows: list[Row], rounds: int) -> list[Row]:
    """``rows`` again for rounds 1..``rounds``, each round's order rotated by one more row."""
    out = []
    for k in range(1, rounds + 1):
        for row in rotated(rows, k):
            extra = timing_only(row.timing_steps or TIMING_STEPS)
            out.append(replace(row, overrides=[*row.overrides, *extra], timing_round=k))
    return out


def timing_rounds(rows: list[Row], rounds: int, root: Path) -> list[dict]:
    """Run the timing rounds (finished runs are reused) and return their results."""
    return run_rows(timing_rows(rows, rounds), root) if rounds > 0 else []


def step_time_ratios(results: list[dict], timings: list[dict], baseline: str) -> dict[tuple[str, str], dict]:
    """(group, row) -> step times and ratios to ``baseline`` (a row name in the same group) per round.

    Round 0 is each row's own run (its first seed); rounds 1.. are :func:`timing_rounds`'."""
    by_round: dict[int, dict[tuple[str, str], dict]] = {}
    for r in results:
        if r["seed"] == min(x["seed"] for x in results if (x["group"], x["row"]) == (r["group"], r["row"])):
            by_round.setdefault(0, {})[(r["group"], r["row"])] = r
    for r in timings:
        by_round.setdefault(r["timing_round"], {})[(r["group"], r["row"])] = r
    out: dict[tuple[str, str], dict] = {}
    for k in sorted(by_round):
        for key, r in by_round[k].items():
            base = by_round[k].get((key[0], baseline))
            t, tb = r["summary"].get("step_time_s"), base and base["summary"].get("step_time_s")
            entry = out.setdefault(key, {"step_time_s": [], "ratio": [], "load_1m": []})
            entry["step_time_s"].append(t)
            entry["load_1m"].append(r.get("load_1m"))
            if t and tb:
                entry["ratio"].append(t / tb)
    for entry in out.values():
        entry.update(summarize(entry["ratio"], "ratio"), **summarize(entry["step_time_s"], "step_time_s"))
    return out


def summarize(values: list, name: str) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {f"{name}_median": None, f"{name}_min": None, f"{name}_max": None, f"{name}_n": 0}
    return {f"{name}_median": statistics.median(vals), f"{name}_min": min(vals), f"{name}_max": max(vals),
            f"{name}_n": len(vals)}


def ratio_cell(entry: dict | None) -> str:
    """'0.54 [0.51–0.58]': the median ratio over rounds and its range."""
    if not entry or entry.get("ratio_median") is None:
        return "–"
    if entry["ratio_n"] == 1:
        return f"{entry['ratio_median']:.2f}"
    return f"{entry['ratio_median']:.2f} [{entry['ratio_min']:.2f}–{entry['ratio_max']:.2f}]"


TIMING_NOTE = ("\nStep time: each row's median step after warm-up, in its own run and in {rounds} more short "
               "run(s) of {steps} steps; the rounds run one after another with the rows in a rotated order, so "
               "ratios to the baseline are taken within a round; shown as the median over the {n} rounds "
               "[min–max]. The 1-minute load average before the runs: {load}.\n")


def timing_note(ratios: dict, rounds: int, steps: str | int = TIMING_STEPS) -> str:
    loads = [v for e in ratios.values() for v in e["load_1m"] if v is not None]
    load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else "not recorded"
    return TIMING_NOTE.format(rounds=rounds, steps=steps, n=rounds + 1, load=load)
