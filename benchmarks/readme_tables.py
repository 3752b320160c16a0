"""The tables ``slimpar bench readme`` puts into README.md and the results pages, each written from one results file
(benchmarks/readme.py's ``{{table:SOURCE:WHICH}}``). Every cell is read from the file; none is typed."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.report import fmt, markdown_table, pm
from benchmarks.sdp import batch_markdown


def _group(src, group: str) -> list[dict]:
    return [ln for ln in src.data["lines"] if ln["group"] == group]


def quality_table(group: str) -> Callable:
    """A group of ``slimpar bench quality``: losses (or accuracy) on both held-out sets, gaps paired by seed."""

    def table(src) -> str:
        lines = _group(src, group)
        if group == "resnet":
            body = [[ln["row"], str(len(ln["seeds"])), pm(_x100(ln["val_accuracy"]), _x100(ln["val_accuracy_std"]), 2),
                     "—" if ln["row"] == "DDP" else pm(ln["val_accuracy_gap"], ln["val_accuracy_gap_std"], 2, True),
                     pm(ln["val_loss"], ln["val_loss_std"]), pm(ln["train_loss"], ln["train_loss_std"])]
                    for ln in lines]
            return markdown_table(["run", "seeds", "val accuracy (%)", "vs DDP (relative)", "val loss",
                                   "train loss, last 10%"], body)
        pipe = group.startswith("mapl") or group in PIPELINE_GROUPS
        tuned = any("lr" in (ln.get("tags") or {}) for ln in lines)
        # a row whose baseline ran before the halves were reported has [None, None]: the column needs a measured one
        halves = any(None not in (ln.get("val_loss_gap_halves") or [None]) for ln in lines)
        body = []
        for ln in lines:
            base = ln["val_loss_gap"] == 0 and not ln.get("val_loss_gap_std")
            row = [LABELS.get(ln["row"], ln["row"]), *([ln["tags"]["lr"]] if tuned else []), str(len(ln["seeds"])),
                   pm(ln["val_loss"], ln["val_loss_std"]),
                   "—" if base else pm(ln["val_loss_gap"], ln["val_loss_gap_std"], 1, pct=True)]
            if halves:
                row.append("—" if base else " / ".join("–" if g is None else f"{100 * g:+.1f}%"
                                                       for g in ln.get("val_loss_gap_halves") or [None, None]))
            row += [pm(ln["val_wikipedia_loss"], ln["val_wikipedia_loss_std"]),
                    "—" if base else pm(ln["val_wikipedia_loss_gap"], ln["val_wikipedia_loss_gap_std"], 1, pct=True)]
            if pipe:
                row.append(f"{fmt(ln['comm_bytes_per_step_fwd_vs_base'], 3)} / "
                           f"{fmt(ln['comm_bytes_per_step_bwd_vs_base'], 3)}")
            body.append(row)
        headers = ["run", *(["lr (tuned)"] if tuned else []), "seeds", "val loss, Shakespeare", "gap",
                   *(["gap, each half"] if halves else []), "val loss, Wikipedia", "gap",
                   *(["bytes fwd / bwd × none"] if pipe else [])]
        return markdown_table(headers, body)

    return table


PIPELINE_GROUPS = ("tuned", "unseen-config")  # the quality groups outside mapl* that are pipelines
# a row whose name in results.json (its key for resuming runs) speaks of the project's history: the pages say
# what it is instead
LABELS = {"MAPL 4x (defaults before issue 20)": "MAPL 4x (old defaults)"}


def sweep_table(group: str) -> Callable:
    """A learning-rate sweep of ``slimpar bench quality``: each row's loss at every rate, the best in bold."""

    def table(src) -> str:
        from benchmarks.quality.report import sweep_markdown

        return sweep_markdown(_group(src, group)).strip("\n").split("\n\n", 1)[1]

    return table


def _x100(v):
    return None if v is None else 100 * v


def measured_targets(src) -> str:
    """The targets whose rows this results file holds (the others are another file's)."""
    from benchmarks.quality.report import _targets_table

    return _targets_table({k: v for k, v in src.data["targets"].items() if v is not None}).rstrip("\n")


def sdp_table(group: str) -> Callable:
    """``slimpar bench sdp``: memory, bytes (mean, and the busiest worker) and step time against DDP."""

    def table(src) -> str:
        body = []
        for ln in _group(src, group):
            floor = ln.get("plan_floor_bytes")
            plan = " (= plan)" if floor and ln["comm_bytes_per_step"] == floor else ""
            body.append([ln["row"], pm(ln["val_loss"], ln["val_loss_spread"]) if ln.get("val_loss") else "–",
                         _mib(ln["peak_mem_bytes"]), fmt(ln.get("peak_mem_bytes_vs_ddp"), 2),
                         _mib(ln["comm_bytes_per_step"]) + plan, fmt(ln.get("comm_bytes_per_step_vs_ddp"), 2),
                         f"{fmt(ln.get('comm_bytes_sent_per_step_max_vs_ddp'), 2)} / "
                         f"{fmt(ln.get('comm_bytes_recv_per_step_max_vs_ddp'), 2)}", _ratio(ln.get("step_time"))])
        return markdown_table(["run", "val loss", "peak memory / worker", "× DDP",
                               "bytes into collectives / step / worker, mean", "× DDP",
                               "max sent / max received per worker × DDP", "step time × DDP"], body)

    return table


def virtual_table(src) -> str:
    """``slimpar bench sdp``'s virtual group: what a step of virtual SDP costs against DDP in one process."""
    body = [[ln["row"], fmt(ln["step_time_s"], 3), _ratio(ln.get("step_time"))] for ln in _group(src, "virtual")]
    return markdown_table(["run (one process, 4 simulated workers)", "step time (s)", "× DDP, median [range]"], body)


def _trend(src, group: str) -> str:
    """A length or width sweep's table and its note (benchmarks/quality/trends.py), from the runs results.json holds."""
    from benchmarks.quality.trends import markdown

    return markdown(src.data["runs"], group).split(":\n\n", 1)[-1].strip()


def _mib(b) -> str:
    return "–" if b is None else f"{b / 2**20:.1f} MiB"


def _ratio(entry: dict | None) -> str:
    from benchmarks.timing import ratio_cell

    return ratio_cell(entry)


def mapl_table(src) -> str:
    """``slimpar bench mapl``: loss, bytes each way against ``none``, orthogonality, SPEL's share, step time."""
    body = []
    for ln in src.data["lines"]:
        orth = ln.get("max_orth_error")
        gap = "—" if ln["row"] == "none" else fmt(ln.get("val_loss_gap"), pct=True)
        spel = f"{100 * ln['spel_time_share']:.1f}%" if orth and ln.get("spel_time_share") is not None else "—"
        body.append([ln["row"], fmt(ln["val_loss"], 3), gap, fmt(ln.get("fwd_bytes_vs_none"), 3),
                     fmt(ln.get("bwd_bytes_vs_none"), 3), f"{orth:.1e}" if orth else "—", spel,
                     _ratio(ln.get("step_time"))])
    return markdown_table(["codec", "val loss", "vs `none`", "bytes / step fwd × `none`", "bwd × `none`",
                           "max ‖AᵀA − I‖", "SPEL share of step", "step time × `none`"], body)


def memory_table(src) -> str:
    """``slimpar bench memory``: the worst worker's predicted peak by part, against DDP and the paper."""
    from benchmarks.memory import PAPER

    ddp = {r["size"]: r["worst"]["peak_live"] for r in src.data["rows"] if r["mode"] == "DDP"}
    body = []
    for r in src.data["rows"]:
        m = r["worst"]
        body.append([r["size"], r["mode"], _gb(m["params"] + m["grads"] + m["optimizer"]), _gb(m["activations"]),
                     _gb(m["peak_live"]), f"{(m['peak_live'] / ddp[r['size']] - 1) * 100:+.0f}%",
                     PAPER.get((r["size"], r["mode"]), "")])
    return markdown_table(["size", "mode", "parameters + gradients + AdamW (GB)", "activations (GB)", "peak (GB)",
                           "vs DDP", "paper"], body)


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


REFERENCES = ("DDP", "none")  # each family's baseline (benchmarks/network/wallclock.py)


def wallclock_table(src) -> str:
    """``slimpar bench wallclock``: measured step time at each link rate, bytes, and where a row pays."""
    rates = src.data["meta"]["rates_mbit"]
    rows: dict[str, dict] = {}
    for ln in src.data["lines"]:
        rows.setdefault(ln["row"], {})[ln["rate_mbit"]] = ln["step_time_s"]
    body = []
    for row, times in rows.items():
        fit = src.data["fits"].get(row, {})  # its bytes: the mean over the rates, as the report's
        pays = "reference" if row in REFERENCES else _pays(fit.get("crossover", {}))
        sent = f"{fit['bytes']:,.0f}" if fit.get("bytes") else "–"
        body.append([row, sent, *(fmt(times.get(r), 3) for r in rates), pays])
    return markdown_table(["row", "inter-node bytes / step", *(f"{r:g} Mbit/s (s)" for r in rates),
                           "pays off against the reference"], body)


def _pays(cross: dict) -> str:
    if not cross:
        return "–"
    if cross.get("pays") == "below":
        return f"below {cross['mbit']:.0f} Mbit/s"
    return {"always": "at every rate", "never": "at no rate"}.get(cross.get("pays"), str(cross.get("pays")))


TABLES: dict[str, Callable] = {
    **{f"quality:{g}": quality_table(g) for g in ("sdp", "mapl", "mapl-deep", "mapl-lr1e-3", "resnet")},
    "quality:targets": measured_targets,  # the tuned, length and unseen-config targets are docs/results/tuned's
    **{f"tuned:{g}": quality_table(g) for g in ("tuned", "sdp-tuned", "unseen-config")},
    **{f"tuned:{g}": sweep_table(g) for g in ("lr-sweep", "sdp-lr-sweep")},
    "tuned:targets": measured_targets,
    "tuned:width": lambda src: _trend(src, "width"),
    "sdp:llama": sdp_table("llama"),
    "sdp:resnet": sdp_table("resnet"),
    "sdp:virtual": virtual_table,
    "batch_size:virtual": virtual_table,
    "batch_size:batch": lambda src: batch_markdown(src.data["lines"]),
    "mapl:main": mapl_table,
    "memory:paper": memory_table,
    "wallclock:main": wallclock_table,
}
