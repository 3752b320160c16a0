"""Run outputs: ``metrics.jsonl`` (one line per logged step), ``summary.json`` and the closing table."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

import torch

from slimpar.utils import fmt_bytes, write_text_atomic

MEM_KINDS = ("params", "grads", "optimizer", "activations", "buffers", "peak_live", "peak_step_alloc",
             "peak_rss_delta")


class MetricsWriter:
    """Appends JSON lines; only rank 0 writes."""

    def __init__(self, out_dir: Path, enabled: bool):
        self.path = Path(out_dir) / "metrics.jsonl"
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def truncate(self, step: int) -> None:
        """Keep only the lines of steps ``<= step`` (the step a run resumes from; 0 = none).

        A run killed after its last checkpoint has already logged the steps it will redo; dropping them
        here means every step appears exactly once. A line cut short by the kill is dropped too. The file
        is replaced atomically, so a second kill during this leaves the old or the new file, never half.
        """
        if not self.enabled or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
                kept.append(line + "\n")
        write_text_atomic(self.path, "".join(kept))


def git_commit() -> str | None:
    """The commit of slimpar's own source tree, or None when slimpar is not run from its git checkout.

    Asking git from the package folder is not enough: a slimpar installed in a virtual environment
    inside the user's repository would report the user's HEAD. The answer counts only if that
    repository's ``slimpar/__init__.py`` is the very file this package was loaded from.
    """
    package = Path(__file__).resolve().parents[2]
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=package, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        if not top or (Path(top) / "slimpar" / "__init__.py").resolve() != package / "__init__.py":
            return None
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=package, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str]:
    import numpy

    import slimpar

    return {"slimpar": slimpar.__version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "machine": f"{platform.machine()} {platform.system()}",
            "cpus": str(torch.get_num_threads())}


def median_step_time(times: list[float], warmup: int = 2) -> float | None:
    steady = times[warmup:] if len(times) > warmup else times
    return statistics.median(steady) if steady else None


def _max_known(values) -> Any:
    """The largest value that is not None; None when no rank has one (e.g. an RSS it could not read)."""
    known = [v for v in values if v is not None]
    return max(known) if known else None


def merge_ranks(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Max over ranks for memory; mean and max over ranks for bytes; keeps each rank's numbers too.

    ``comm_bytes`` is what a rank fed into collectives (a broadcast counted at its root only);
    ``comm_bytes_sent``/``_recv`` are its modelled bytes sent and received (parallel/comm.traffic)."""
    mem = {k: _max_known(r["mem"].get(k) for r in per_rank) for k in per_rank[0]["mem"]}
    comm = [r["comm_bytes"] for r in per_rank]
    wire = [r["wire_bytes"] for r in per_rank if r["wire_bytes"] is not None]
    out = {
        "peak_mem_bytes": mem.get("peak_live"),
        "mem_breakdown": mem,
        "comm_bytes_per_step": sum(comm) / len(comm),
        "wire_bytes_per_step": (sum(wire) / len(wire)) if wire else None,
        "wire_bytes_per_step_max": max(wire) if wire else None,
    }
    for key in ("cuda_max_allocated_bytes", "cuda_max_reserved_bytes"):  # on a GPU: the largest rank's
        if any(key in r for r in per_rank):
            out[key] = _max_known(r.get(key) for r in per_rank)
    for kind in ("sent", "recv"):
        vals = [r.get(f"comm_bytes_{kind}") for r in per_rank]
        known = [v for v in vals if v is not None]
        full = len(known) == len(vals)
        out[f"comm_bytes_{kind}_per_step_mean"] = sum(known) / len(known) if full else None
        out[f"comm_bytes_{kind}_per_step_max"] = max(known) if full else None
    return out | {"per_rank": per_rank}


VAL_GAP = 3.0  # a validation loss this many times the training loss draws the closing warning


def val_gap_warning(train_loss: float, val_loss: float | None, fix: str) -> str | None:
    """A warning when ``val_loss`` > VAL_GAP x ``train_loss`` (None otherwise, or where either is unknown)."""
    if val_loss is None or not train_loss > 0 or not val_loss > VAL_GAP * train_loss:
        return None
    return (f"validation loss {val_loss:.4g} is {val_loss / train_loss:.1f}x the training loss {train_loss:.4g} "
            f"(more than {VAL_GAP:g}x): {fix}")


def _mean_max(summary: dict[str, Any], mean: str, most: str) -> str:
    if summary.get(mean) is None:
        return "-"
    return f"{fmt_bytes(summary[mean])} (max {fmt_bytes(summary.get(most))})"


def print_summary(summary: dict[str, Any], extra_rows: list[tuple[str, str]] | None = None) -> None:
    """The closing table of ``slimpar train`` (rank 0)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"slimpar run summary ({summary['mode']}, {summary['world_size']} workers)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [("steps", str(summary["steps"])), ("train loss", f"{summary['train_loss']:.4f}")]
    for k, v in summary.items():
        if k.startswith("val") and isinstance(v, float):
            rows.append((k.replace("_", " "), f"{v:.4f}"))
    mem = summary.get("mem_breakdown") or {}  # absent when this invocation ran no step (a resume at the end)
    rows += [("peak memory / worker (live tensors)", fmt_bytes(summary.get("peak_mem_bytes")))]
    rows += [(f"  {k}", fmt_bytes(mem.get(k))) for k in ("params", "grads", "optimizer", "activations")]
    rss, step = mem.get("peak_rss_delta"), fmt_bytes(mem.get("peak_step_alloc"))
    rows += [("  peak allocated in step: tracker, RSS (cross-check)",
              f"{step}, {fmt_bytes(rss)}" if rss is not None else f"{step}, - (needs MALLOC_MMAP_THRESHOLD_=65536)")]
    rows += [("bytes / step / worker (fed into collectives, mean)", fmt_bytes(summary.get("comm_bytes_per_step"))),
             ("bytes sent / step / worker (model: mean, max)",
              _mean_max(summary, "comm_bytes_sent_per_step_mean", "comm_bytes_sent_per_step_max")),
             ("bytes received / step / worker (model: mean, max)",
              _mean_max(summary, "comm_bytes_recv_per_step_mean", "comm_bytes_recv_per_step_max")),
             ("bytes written to wire / step / worker (mean, max)",
              _mean_max(summary, "wire_bytes_per_step", "wire_bytes_per_step_max"))]
    st = summary.get("step_time_s")
    rows += [("step time (median)", f"{st * 1000:.1f} ms" if st else "-"),
             ("tokens or samples / s", f"{summary['tokens_per_s']:.0f}" if summary.get("tokens_per_s") else "-")]
    for name, value in rows + (extra_rows or []):
        table.add_row(name, value)
    Console(width=max(Console().width, 110)).print(table)
