"""Shared pieces of benchmark reports: metadata, Markdown tables, mean and spread over seeds."""

from __future__ import annotations

import datetime
import json
import platform
import statistics
from pathlib import Path

from slimpar.train.sinks.metrics import git_commit, versions

# what a row's compression K means, for the reports' headers: the rows pinned to the meaning they were measured in
COMPRESSION_NOTE = ("Compression K: rows with a rank (MAPL, SSN, naive) divide the boundary payload, r = d / K "
                    "(`--pipeline.compression_of payload`), unless their command names `compression_of total` (every "
                    "byte a boundary sends at most 1/K of none's, slimpar's default).")


def metadata(extra: dict | None = None) -> dict:
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit(), "versions": versions(), "machine": platform.platform(),
            "cpus": __import__("os").cpu_count(), **(extra or {})}


def mean_spread(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and (population) standard deviation over seeds; spread None for a single seed."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.pstdev(vals) if len(vals) > 1 else None)


def pm(mean, std, digits: int = 3, pct: bool = False) -> str:
    """'3.570 ± 0.026', or with ``pct`` a fraction as '+9.6% ± 0.7'; '–' without a mean."""
    if mean is None:
        return "–"
    scale = 100 if pct else 1
    head = f"{scale * mean:+.{digits}f}%" if pct else f"{mean:.{digits}f}"
    return head + (f" ± {scale * std:.{digits}f}" if std is not None else "")


def fmt(v, digits: int = 3, pct: bool = False) -> str:
    if v is None:
        return "–"
    if pct:
        return f"{100 * v:+.1f}%"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` whole or not at all: a benchmark killed mid-write keeps the file it had (a quality
    results.json is the only record of runs whose folders are gone)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


def run_commits(runs: list[dict]) -> list[str]:
    """The commits the runs' own summaries name, oldest first in run order (one when all ran on one)."""
    seen: dict[str, None] = {}
    for r in runs:
        commit = (r.get("summary") or {}).get("git_commit")
        if commit:
            seen.setdefault(commit, None)
    return list(seen)


def commits_note(meta: dict) -> str:
    """A sentence for a report whose rows ran on more than one commit ('' when they ran on one)."""
    commits = meta.get("run_commits") or []
    if len(commits) <= 1:
        return ""
    names = ", ".join(f"`{c[:7]}`" for c in commits)
    return (f"**Mixed commits:** the rows ran on {len(commits)} commits ({names}); the header names the commit "
            "the report was written at. Each run's commit is in results.json (`runs[i].summary.git_commit`).\n\n")
