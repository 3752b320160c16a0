"""Rerun recorded rows of the quality study at this commit and compare them with the record, paired by seed.

    python -m benchmarks.quality.rerun --rows "mapl/none,mapl/MAPL 4x" --out DIR [--jobs 2] [--commit SHA]
        [--baseline RESULTS_JSON]

Each run is the recorded command (``docs/results/quality/results.json``), one thread, with ``--eval.final_tokens
0``: the final evaluation those runs made (eval.batches × eval.batch_size × seq_len tokens per split) before
llama_quality.toml began scoring 262k tokens at the end, and the recorded values of the pipeline options whose
defaults changed since (``RECORDED_DEFAULTS``) where the command leaves them out. A finished run folder under
``DIR/runs`` is reused. ``--commit`` trains at another commit (a detached git worktree of this repository, its own
slimpar on the path); ``--baseline`` compares with another results.json (this tool's, e.g. runs at the commit before
a change) instead of the record. ``DIR/results.json`` keeps the runs; ``DIR/report.md`` names the commits each
side's runs trained at (their summaries) and has, per row, the baseline's and the rerun's validation loss (mean ±
sample std over seeds), the paired change and the gap to the group's ``none`` both times, and says whether the
change lies within the baseline seeds' spread (|mean change| ≤ the baseline row's std, as a fraction).

Why: a change that is meant to leave training the same to rounding (batched SPEL, the one-pass virtual pipeline,
compiled codec regions) must not move a row's loss beyond what its seeds already differ by.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.quality.harness import thin
from benchmarks.report import metadata, write_json
from benchmarks.runner import Row, run_row

RECORD = Path(__file__).resolve().parents[2] / "docs" / "results" / "quality" / "results.json"
RECORDED_EVAL = ["--eval.final_tokens", "0"]
# The pipeline defaults the recorded runs trained with where a default changed since (compression K of the payload,
# r = d / K, before every byte counted; MAPL's defaults before the tuned study: no anchors, symmetric tables, ids on
# the wire, SPEL on the model's schedule at 0.01, A in the global clip). A recorded command that does not name one
# of these options gets the recorded value, so the rerun trains the recorded configuration: the same r and bytes.
RECORDED_DEFAULTS = {"--pipeline.compression_of": "payload", "--pipeline.anchors": "none",
                     "--pipeline.anchor_form": "symmetric", "--pipeline.ids": "send", "--pipeline.spel_lr": "0.01",
                     "--pipeline.spel_schedule": "model", "--pipeline.clip_projector": "global"}


def recorded(names: list[str], record: Path = RECORD) -> list[dict]:
    """The recorded runs of ``names`` ("group/row"), every seed; ValueError naming a row the record lacks."""
    import json

    runs = json.loads(record.read_text())["runs"]
    found = [r for r in runs if f"{r['group']}/{r['row']}" in names]
    missing = sorted(set(names) - {f"{r['group']}/{r['row']}" for r in found})
    if missing:
        raise ValueError(f"not in {record}: {', '.join(missing)}")
    return found


def row_of(run: dict) -> Row:
    """The recorded run as a row: its config, seed and overrides, with the recorded final evaluation."""
    words = shlex.split(run["command"])
    assert words[:4] == ["slimpar", "train", "--config", words[3]] and words[4] == "--train.seed", run["command"]
    extra = [] if "--eval.final_tokens" in words else RECORDED_EVAL
    if "--pipeline.codec" in words:
        extra = [w for flag, value in RECORDED_DEFAULTS.items() if flag not in words for w in (flag, value)] + extra
    return Row(run["row"], words[3], [*words[6:], *extra], run["group"], run["seed"], env={"OMP_NUM_THREADS": "1"})


def worktree_at(commit: str, out: Path) -> Path:
    """A detached worktree of this repository at ``commit`` under ``out`` (made once)."""
    import subprocess

    tree = out / f"worktree-{commit}"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=RECORD.parents[3], check=True,
                       capture_output=True)
    return tree


def _commits(runs: list[dict]) -> str:
    return ", ".join(f"`{c[:7]}`" for c in dict.fromkeys(r["summary"].get("git_commit") or "?" for r in runs))


def _stats(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def compare(old: list[dict], new: list[dict]) -> list[dict]:
    """Per row: recorded and rerun val loss, the paired change and the gaps to the group's none, by seed."""
    was = {(r["group"], r["row"], r["seed"]): r["summary"]["val_loss"] for r in old}
    now = {(r["group"], r["row"], r["seed"]): r["summary"]["val_loss"] for r in new}
    bytes_was = {(r["group"], r["row"], r["seed"]): _bytes(r) for r in old}
    bytes_now = {(r["group"], r["row"], r["seed"]): _bytes(r) for r in new}
    lines = []
    for group, row in dict.fromkeys((g, r) for g, r, _ in now):
        seeds = sorted(s for g, r, s in now if (g, r) == (group, row))
        a, b = [was[group, row, s] for s in seeds], [now[group, row, s] for s in seeds]
        change = [y / x - 1 for x, y in zip(a, b, strict=True)]
        line = {"group": group, "row": row, "seeds": seeds, "recorded": _stats(a), "rerun": _stats(b),
                "change": _stats(change), "recorded_rel_std": _stats(a)[1] / _stats(a)[0]}
        line["within_spread"] = abs(line["change"][0]) <= line["recorded_rel_std"]
        line["same_bytes"] = all(bytes_now[group, row, s] == bytes_was.get((group, row, s)) for s in seeds)
        if row != "none" and all((group, "none", s) in now for s in seeds):
            line["gap_recorded"] = _stats([was[group, row, s] / was[group, "none", s] - 1 for s in seeds])
            line["gap_rerun"] = _stats([now[group, row, s] / now[group, "none", s] - 1 for s in seeds])
        lines.append(line)
    return lines


def _bytes(run: dict) -> tuple:
    """A run's boundary bytes per step, each way (bytes must not move either)."""
    return tuple(run["summary"].get(k) for k in ("comm_bytes_per_step_fwd", "comm_bytes_per_step_bwd"))


def _pct(ms: tuple[float, float]) -> str:
    return f"{100 * ms[0]:+.2f}% ± {100 * ms[1]:.2f}"


def report(lines: list[dict], meta: dict) -> str:
    head = (f"# Quality rows rerun against {meta['baseline']}\n\nWritten {meta['date']} by `{meta['command']}`, "
            f"torch {meta['versions']['torch']}, {meta['cpus']} CPUs. The baseline's runs trained at "
            f"{meta['baseline_commits']}; the rerun's at {meta['rerun_commits']}. Each rerun is the recorded "
            "command with the recorded final evaluation (`--eval.final_tokens 0`), one thread, 2 runs at a time. "
            "Options whose defaults changed since the record are pinned to the recorded ones where the command "
            "does not name them (`RECORDED_DEFAULTS`). Mean ± sample std over seeds; changes and gaps are paired by "
            "seed. Within spread: |mean change| ≤ the baseline seeds' std. Bytes as baseline: every seed's boundary "
            "bytes per step, each way, equal to the baseline run's.\n\n")
    rows = ["| row | seeds | baseline val loss | rerun val loss | paired change | baseline seeds' std | within "
            "spread | gap to none, baseline | gap to none, rerun | bytes as baseline |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for ln in lines:
        gaps = [_pct(ln[k]) if k in ln else "–" for k in ("gap_recorded", "gap_rerun")]
        rows.append(f"| {ln['group']} / {ln['row']} | {len(ln['seeds'])} | {ln['recorded'][0]:.4f} ± "
                    f"{ln['recorded'][1]:.4f} | {ln['rerun'][0]:.4f} ± {ln['rerun'][1]:.4f} | {_pct(ln['change'])} | "
                    f"{100 * ln['recorded_rel_std']:.2f}% | {'yes' if ln['within_spread'] else '**no**'} | "
                    f"{gaps[0]} | {gaps[1]} | {'yes' if ln.get('same_bytes') else '**no**'} |")
    return head + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.rerun", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", required=True, help="comma-separated group/row names of the record")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--commit", help="train at this commit (a git worktree under --out) instead of this checkout")
    p.add_argument("--baseline", type=Path, default=RECORD, help="the runs to compare with (default: the record)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    record = recorded(names)  # the commands
    old = recorded(names, args.baseline)
    args.out.mkdir(parents=True, exist_ok=True)
    tree = worktree_at(args.commit, args.out) if args.commit else None
    with ThreadPoolExecutor(args.jobs) as pool:
        new = [thin(run) for run in pool.map(lambda r: run_row(row_of(r), args.out, checkout=tree), record)]
    base, root = args.baseline.resolve(), RECORD.parents[3]
    words = argv if argv is not None else sys.argv[1:]
    meta = metadata({"baseline": str(base.relative_to(root) if base.is_relative_to(root) else base),
                     "baseline_commits": _commits(old), "rerun_commits": _commits(new),
                     "command": shlex.join(["python", "-m", "benchmarks.quality.rerun", *words])})
    lines = compare(old, new)
    write_json(args.out / "results.json", {"meta": meta, "lines": lines, "runs": new})
    (args.out / "report.md").write_text(report(lines, meta))
    print(report(lines, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
