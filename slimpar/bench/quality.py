"""``slimpar bench quality``: the long-regime quality benchmark, 3 seeds per row, in one process per run.

Every run is a real ``slimpar train`` job with one process and one thread, so two runs share a 2-core
machine side by side: SDP rows are virtual SDP (``--sdp.virtual true``, 4 simulated workers; equal to 4
processes, tests/unit/test_sdp_virtual.py) and pipeline rows are virtual pipelines (4 stages in one
process). Memory and bytes are not measured here (``bench sdp`` and ``bench mapl`` do that with real
processes); this benchmark measures loss only.

Groups (``config`` llama_quality.toml: d = 128, 1024-token BPE, 2,000 steps of 8 x 64 tokens):

- ``sdp``: 8 blocks. DDP is one process on the same global batch (DDP's averaged gradient is the
  gradient of the global batch). B-SDP 0.5 and 3/8, N-SDP 0.5, Bb-SDP 0.5 and 3/8, FLOP-matched B-SDP 0.5.
- ``mapl``: 4 blocks in 4 stages (one block per stage). The codecs of ``bench mapl`` and the projector
  ablations of issue 10. The schedule is GPipe with one micro-batch: in one process a schedule only
  orders the same computations, and one micro-batch is the fastest.
- ``mapl-deep``: the all-boundary variant closer to the paper: 8 blocks, 2 per stage.
- ``resnet``: ResNet-18 at width 16 on Fashion-MNIST for 3 epochs (width 64 takes 2.7 s a step here).

Rows are resumable twice over: a finished row's ``summary.json`` is reused, and an interrupted run
resumes from its last checkpoint (every 500 steps). The report, the JSON and the plots are rewritten
after every finished run, so an interrupted benchmark still leaves a report of what finished.
"""

from __future__ import annotations

import os
import statistics
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from slimpar.bench.mapl import ROWS as CODECS
from slimpar.bench.report import fmt, markdown_table, metadata, write_json
from slimpar.bench.runner import Row, run_row, select_rows

CONFIG = "configs/llama_quality.toml"
SEEDS = (0, 1, 2)
STEPS = 2000
SDP = ["--model.n_layers", "8", "--parallel.mode", "sdp", "--sdp.virtual", "true", "--sdp.virtual_workers", "4"]
PIPE = ["--parallel.mode", "pipeline", "--pipeline.virtual", "true", "--pipeline.stages", "4",
        "--model.tie_embeddings", "false", "--pipeline.schedule", "gpipe", "--pipeline.microbatches", "1"]


def _sdp(level: str, keep: float, regime: str = "forward", *extra: str) -> list[str]:
    return [*SDP, "--sdp.level", level, "--sdp.keep", str(keep), "--sdp.regime", regime, *extra]


SDP_ROWS = {
    "DDP": ["--model.n_layers", "8"],
    "B-SDP 0.5": _sdp("block", 0.5),
    "B-SDP 0.5 FLOP-matched": _sdp("block", 0.5, "forward", "--sdp.flop_matched", "true"),
    "Bb-SDP 3/8": _sdp("block", 0.375, "backward"),
    "B-SDP 3/8": _sdp("block", 0.375),
    "N-SDP 0.5": _sdp("neuron", 0.5),
    "Bb-SDP 0.5": _sdp("block", 0.5, "backward"),
}
MAPL_MAIN = ("none", "MAPL 4x", "SSN 4x", "naive 4x", "MAPL 4x + all changes", "MAPL 8x", "SSN 8x",
             "MAPL 16x + RVQ", "int8", "bf16", "MAPL 4x + anchors")
MAPL_ABLATIONS = ("MAPL 4x + PCA init", "MAPL 4x + own SPEL schedule", "MAPL 4x + separate clip",
                  "MAPL 4x + zero anchors", "MAPL 4x + PCA + frozen after N")
DEEP = ("none", "SSN 4x", "MAPL 4x", "MAPL 4x + all changes")
# ResNet-18 (CIFAR stem) at width 16: 3 epochs of Fashion-MNIST's 60,000 images at batch 64
RESNET = ["--model.width", "16", "--train.steps", "2813", "--eval.every", "0", "--eval.batches", "50",
          "--eval.batch_size", "200", "--checkpoint.every", "500", "--checkpoint.keep_last", "1",
          "--checkpoint.export", "false", "--checkpoint.final", "false", "--log.every", "25",
          "--log.progress", "false", "--parallel.workers", "1"]
RESNET_ROWS = {
    "DDP": ["--parallel.mode", "single"],
    "B-SDP 0.5": ["--parallel.mode", "sdp", "--sdp.virtual", "true", "--sdp.keep", "0.5",
                  "--sdp.bn_recalibrate", "20"],
    "N-SDP 0.5": ["--parallel.mode", "sdp", "--sdp.virtual", "true", "--sdp.level", "neuron", "--sdp.keep", "0.5",
                  "--sdp.bn_recalibrate", "20"],
}
BASELINE = {"sdp": "DDP", "mapl": "none", "mapl-deep": "none", "resnet": "DDP"}
GROUPS = ("mapl", "sdp", "mapl-ablations", "mapl-deep", "resnet")


def _codec(name: str, steps: int) -> list[str]:
    return [a.format(freeze=str(max(steps // 10, 1))) for a in CODECS[name]]


def rows(steps: int = STEPS, seeds: tuple[int, ...] = SEEDS, groups: tuple[str, ...] = GROUPS,
         extra: tuple[str, ...] = ()) -> list[Row]:
    """Every run in the order it runs: the claims' main rows first, all seeds of a row together."""
    base = ["--train.steps", str(steps), *extra]
    plan: list[tuple[str, str, list[str]]] = []
    mapl = [("mapl", n, ["--model.n_layers", "4", *PIPE, *_codec(n, steps)]) for n in MAPL_MAIN]
    sdp = [("sdp", n, o) for n, o in SDP_ROWS.items()]
    if "mapl" in groups:
        plan += mapl[:4]
    if "sdp" in groups:
        plan += sdp[:4]
    if "mapl" in groups:
        plan += mapl[4:]
    if "sdp" in groups:
        plan += sdp[4:]
    if "mapl-ablations" in groups:
        plan += [("mapl", n, ["--model.n_layers", "4", *PIPE, *_codec(n, steps)]) for n in MAPL_ABLATIONS]
    if "mapl-deep" in groups:
        plan += [("mapl-deep", n, ["--model.n_layers", "8", *PIPE, *_codec(n, steps)]) for n in DEEP]
    out = [Row(name, CONFIG, base + o, group, s) for group, name, o in plan for s in seeds]
    if "resnet" in groups:
        out += [Row(n, "configs/resnet18_fmnist.toml", RESNET + o + list(extra), "resnet", s)
                for n, o in RESNET_ROWS.items() for s in seeds]
    return out


def quick_rows() -> list[Row]:
    """The harness end to end in under a minute: two SDP and two pipeline rows, 2 seeds, 8 steps."""
    extra = ("--eval.every", "4", "--log.every", "2", "--eval.batches", "1", "--checkpoint.every", "0",
             "--data.ood", "wikipedia")
    picked = {("sdp", "DDP"), ("sdp", "B-SDP 0.5"), ("mapl", "none"), ("mapl", "MAPL 4x + all changes")}
    return [r for r in rows(8, (0, 1), ("mapl", "sdp", "mapl-ablations"), extra) if (r.group, r.name) in picked]


def _mean_std(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n - 1) over seeds; std None for fewer than 2 values."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)


def _final_val(run: dict, key: str):
    return run["summary"].get(key)


def _val_at(run: dict, step: int, key: str = "val_loss"):
    hits = [c[key] for c in run["curve"] if c.get("step") == step and c.get(key) is not None]
    return hits[0] if hits else None


def _tail_loss(run: dict, fraction: float = 0.1):
    """The training loss averaged over the logged steps of the run's last 10% (one batch's loss is noisy)."""
    steps = run["summary"].get("steps") or 0
    tail = [c["loss"] for c in run["curve"] if c.get("loss") is not None and c["step"] > steps * (1 - fraction)]
    return statistics.fmean(tail) if tail else None


def _base_mean(base: list[dict] | None, key: str):
    return _mean_std([r["summary"].get(key) for r in base])[0] if base else None


def _gap(runs: list[dict], base: list[dict] | None, key: str) -> tuple[float | None, float | None]:
    """Relative gap to the baseline, paired by seed: mean and std of (row_s / base_s - 1) over shared seeds."""
    if not base:
        return None, None
    by_seed = {r["seed"]: _final_val(r, key) for r in base}
    gaps = [v / by_seed[r["seed"]] - 1 for r in runs
            if (v := _final_val(r, key)) is not None and by_seed.get(r["seed"])]
    return _mean_std(gaps)


def aggregate(results: list[dict]) -> list[dict]:
    """One line per (group, row): mean ± std over seeds of the final losses, and the paired gaps."""
    lines: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        lines.setdefault((r["group"], r["row"]), []).append(r)
    out = []
    for (group, name), runs in lines.items():
        base = lines.get((group, BASELINE.get(group, "")))
        steps = runs[0]["summary"].get("steps")
        line = {"group": group, "row": name, "seeds": sorted(r["seed"] for r in runs), "steps": steps,
                "command": runs[0]["command"]}
        for key in ("val_loss", "val_wikipedia_loss", "val_accuracy"):
            line[key], line[f"{key}_std"] = _mean_std([_final_val(r, key) for r in runs])
            line[f"{key}_gap"], line[f"{key}_gap_std"] = _gap(runs, base, key)
        line["train_loss"], line["train_loss_std"] = _mean_std([_tail_loss(r) for r in runs])
        for key in ("comm_bytes_per_step_fwd", "comm_bytes_per_step_bwd"):  # pipeline groups: counted at the sends
            mine, ref = _mean_std([r["summary"].get(key) for r in runs])[0], _base_mean(base, key)
            line[f"{key}_vs_base"] = mine / ref if mine is not None and ref else None
        if steps:  # how much the validation loss still fell over the last quarter of the run
            q = [_val_at(r, steps * 3 // 4 // 250 * 250) for r in runs]
            drops = [a - _final_val(r, "val_loss") for a, r in zip(q, runs, strict=True)
                     if a is not None and _final_val(r, "val_loss") is not None]
            line["val_drop_last_quarter"] = statistics.fmean(drops) if drops else None
        out.append(line)
    return out


def _line(lines: list[dict], group: str, row: str) -> dict | None:
    return next((ln for ln in lines if ln["group"] == group and ln["row"] == row), None)


def _within(ln: dict | None, limit: float) -> dict | None:
    if ln is None or ln.get("val_loss_gap") is None:
        return None
    gap, std = ln["val_loss_gap"], ln["val_loss_gap_std"]
    return {"gap": gap, "gap_std": std, "met": gap <= limit, "within_std": gap - (std or 0) <= limit}


def _ahead(lines: list[dict], group: str, mine: str, other: str) -> dict | None:
    """``mine`` ahead of ``other`` by more than the seed spread: mean(other) - mean(mine) > std(mine) + std(other)."""
    a, b = _line(lines, group, mine), _line(lines, group, other)
    if not a or not b or a["val_loss"] is None or b["val_loss"] is None:
        return None
    lead, spread = b["val_loss"] - a["val_loss"], (a["val_loss_std"] or 0) + (b["val_loss_std"] or 0)
    return {"lead": lead, "spread": spread, "met": lead > spread}


def targets(lines: list[dict]) -> dict[str, dict | None]:
    """Issue 10's targets, each with the measured number and whether it was met (None: rows not run)."""
    return {
        "B-SDP 0.5 iteration-matched within 1% of DDP": _within(_line(lines, "sdp", "B-SDP 0.5"), 0.01),
        "B-SDP 0.5 FLOP-matched at or below DDP": _within(_line(lines, "sdp", "B-SDP 0.5 FLOP-matched"), 0.0),
        "Bb-SDP 3/8 within 1% of DDP": _within(_line(lines, "sdp", "Bb-SDP 3/8"), 0.01),
        "MAPL 4x ahead of SSN 4x by more than the seed spread": _ahead(lines, "mapl", "MAPL 4x", "SSN 4x"),
        "MAPL 4x ahead of naive 4x by more than the seed spread": _ahead(lines, "mapl", "MAPL 4x", "naive 4x"),
        "MAPL 8x ahead of SSN 8x by more than the seed spread": _ahead(lines, "mapl", "MAPL 8x", "SSN 8x"),
        "MAPL 4x within 1% of none (the paper's number)": _within(_line(lines, "mapl", "MAPL 4x"), 0.01),
        "MAPL 16x + RVQ within 3% of none": _within(_line(lines, "mapl", "MAPL 16x + RVQ"), 0.03),
    }


def n_params(group: str) -> int | None:
    """Parameters of the group's model (the LLaMA groups; embeddings untied in the pipeline groups)."""
    from slimpar.models.llama import Llama, LlamaConfig

    layers = {"sdp": 8, "mapl": 4, "mapl-deep": 8}.get(group)
    if layers is None:
        return None
    cfg = LlamaConfig.named("mini", n_layers=layers, vocab_size=1024, tie_embeddings=group == "sdp")
    return sum(p.numel() for p in Llama(cfg).parameters())


def _pm(mean, std, digits: int = 4, pct: bool = False) -> str:
    if mean is None:
        return "–"
    if pct:
        return f"{100 * mean:+.2f}%" + (f" ± {100 * std:.2f}" if std is not None else "")
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def report_markdown(lines: list[dict], meta: dict, pending: list[str], failed: list[str]) -> str:
    out = [f"# slimpar bench quality\n\nMeasured {meta['date']} on {meta['machine']} ({meta['cpus']} CPUs), commit "
           f"`{meta['git_commit']}`, torch {meta['versions']['torch']}. Each run is one `slimpar train` process on one "
           f"thread (virtual SDP / virtual pipeline); {meta.get('jobs', 1)} runs at a time. Values are mean ± sample "
           "std over seeds; gaps are paired by seed (row_s / baseline_s − 1, then mean ± std).\n"]
    for group in dict.fromkeys(ln["group"] for ln in lines):
        mine = [ln for ln in lines if ln["group"] == group]
        params, s0 = n_params(group), mine[0]["steps"]
        tokens = f"; {s0 * 8 * 64 / params:.2f} tokens per parameter" if params and s0 else ""
        out.append(f"\n## {group}\n\n" + (f"{params:,} parameters{tokens} at {s0} steps.\n\n" if params else ""))
        acc = group == "resnet"
        pipe = group.startswith("mapl")
        headers = ["row", "seeds", "steps", "val accuracy" if acc else "val loss (Shakespeare)", "gap vs baseline",
                   *([] if acc else ["val loss (Wikipedia)", "gap vs baseline", "val drop, last quarter"]),
                   "train loss, last 10% of steps", *(["bytes fwd / bwd × none"] if pipe else [])]
        body = []
        for ln in mine:
            key = "val_accuracy" if acc else "val_loss"
            cells = [ln["row"], str(len(ln["seeds"])), str(ln["steps"]), _pm(ln[key], ln[f"{key}_std"]),
                     _pm(ln[f"{key}_gap"], ln[f"{key}_gap_std"], pct=True)]
            if not acc:
                cells += [_pm(ln["val_wikipedia_loss"], ln["val_wikipedia_loss_std"]),
                          _pm(ln["val_wikipedia_loss_gap"], ln["val_wikipedia_loss_gap_std"], pct=True),
                          fmt(ln.get("val_drop_last_quarter"), 4)]
            cells.append(_pm(ln["train_loss"], ln["train_loss_std"]))
            if pipe:
                cells.append(f"{fmt(ln['comm_bytes_per_step_fwd_vs_base'], 3)} / "
                             f"{fmt(ln['comm_bytes_per_step_bwd_vs_base'], 3)}")
            body.append(cells)
        out.append(markdown_table(headers, body) + "\n")
    out.append("\n## Targets (issue 10)\n\n" + _targets_table(targets(lines)))
    if pending:
        out.append(f"\nNot run yet ({len(pending)} runs): " + ", ".join(pending) + "\n")
    if failed:
        out.append(f"\nFailed ({len(failed)} runs; see runs/*/failed.log): " + ", ".join(failed) + "\n")
    out.append("\nCommands (one seed each; the others differ in `--train.seed`):\n\n" + "\n".join(
        f"- {ln['group']} / {ln['row']}: `{ln['command']}`" for ln in lines) + "\n")
    return "".join(out)


def _targets_table(t: dict[str, dict | None]) -> str:
    body = []
    for name, v in t.items():
        if v is None:
            body.append([name, "not run", "–"])
        elif "lead" in v:
            lead = f"lead {v['lead']:+.4f} nats vs spread {v['spread']:.4f}"
            body.append([name, lead, "met" if v["met"] else "missed"])
        else:
            verdict = "met" if v["met"] else "missed by less than 1 std" if v["within_std"] else "missed"
            body.append([name, _pm(v["gap"], v["gap_std"], pct=True), verdict])
    return markdown_table(["target", "measured", ""], body) + "\n"


def _points(run: dict, key: str) -> dict[int, float]:
    """step -> value of ``key`` over the run; validation keys end with the final evaluation from the summary."""
    points = {c["step"]: c[key] for c in run["curve"] if c.get(key) is not None}
    final, steps = run["summary"].get(key), run["summary"].get("steps")
    if key.startswith("val_") and final is not None and steps:
        points[steps] = final
    return points


def _mean_curve(runs: list[dict], key: str) -> tuple[list[int], list[float]]:
    """The curve of ``key`` averaged over seeds at the steps every seed logged."""
    per_seed = [_points(r, key) for r in runs]
    steps = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    return steps, [statistics.fmean(s[k] for s in per_seed) for k in steps]


def plots(results: list[dict], lines: list[dict], out: Path) -> None:
    """Per LLaMA group: training and validation loss against step (mean over seeds), and the gaps with error bars."""
    from slimpar.bench.plots import _plt

    plt = _plt()
    for group in dict.fromkeys(ln["group"] for ln in lines):
        runs = [r for r in results if r["group"] == group]
        names = list(dict.fromkeys(r["row"] for r in runs))
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        key = "val_accuracy" if group == "resnet" else "val_loss"
        for name in names:
            mine = [r for r in runs if r["row"] == name]
            axes[0].plot(*_mean_curve(mine, "loss"), label=name, lw=0.8)
            axes[1].plot(*_mean_curve(mine, key), label=name, lw=1, marker=".")
        axes[0].set(xlabel="step", ylabel="training loss (mean over seeds)", title=f"{group}: training loss")
        axes[1].set(xlabel="step", ylabel=f"{key} (mean over seeds)", title=f"{group}: validation")
        if group != "resnet":
            axes[0].set_ylim(top=min(6.0, axes[0].get_ylim()[1]))
        axes[1].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / f"curves_{group}.png", dpi=120)
        plt.close(fig)
        _gap_curves(plt, runs, names, group, key, out / f"gap_vs_step_{group}.png")
        mine = [ln for ln in lines if ln["group"] == group and ln.get(f"{key}_gap") is not None]
        if mine:
            fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(mine)), 4))
            ax.bar(range(len(mine)), [100 * ln[f"{key}_gap"] for ln in mine],
                   yerr=[100 * (ln[f"{key}_gap_std"] or 0) for ln in mine], capsize=3)
            ax.set_xticks(range(len(mine)), [ln["row"] for ln in mine], rotation=45, ha="right", fontsize=7)
            ax.set_ylabel(f"{key} gap vs {BASELINE.get(group)} (%), ± std over seeds")
            ax.axhline(0, color="black", lw=0.5)
            fig.tight_layout()
            fig.savefig(out / f"gaps_{group}.png", dpi=120)
            plt.close(fig)


def _gap_curves(plt, runs: list[dict], names: list[str], group: str, key: str, path: Path) -> None:
    """Each row's validation gap to the baseline at every evaluation, paired by seed, mean over seeds:
    does the gap close as training goes on?"""
    base = {r["seed"]: _points(r, key) for r in runs if r["row"] == BASELINE.get(group)}
    if not base:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in names:
        if name == BASELINE.get(group):
            continue
        per_step: dict[int, list[float]] = {}
        for r in (r for r in runs if r["row"] == name and r["seed"] in base):
            for step, v in _points(r, key).items():
                if step in base[r["seed"]]:
                    per_step.setdefault(step, []).append(v / base[r["seed"]][step] - 1)
        steps = sorted(per_step)
        ax.plot(steps, [100 * statistics.fmean(per_step[s]) for s in steps], label=name, marker=".", lw=1)
    ax.axhline(0, color="black", lw=0.5)
    ax.set(xlabel="step", ylabel=f"{key} gap vs {BASELINE.get(group)} (%)", title=f"{group}: gap during training")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bench_quality(out: Path, quick: bool, only: set[str] | None = None, jobs: int = 2,
                  steps: int = STEPS, report_only: bool = False) -> dict:
    """Run (or reuse) every selected run, ``jobs`` at a time, rewriting the report after each one.

    ``report_only`` trains nothing: the report covers the finished runs and lists the others as not run."""
    out.mkdir(parents=True, exist_ok=True)
    todo = select_rows(quick_rows() if quick else rows(steps), only)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per run: ``jobs`` runs share the cores
    results: dict[str, dict] = {}
    failed: list[str] = []
    lock = threading.Lock()
    meta = metadata({"quick": quick, "jobs": jobs, "steps": steps})
    if report_only:
        results = {r.key: run_row(r, out) for r in todo if (out / "runs" / r.key / "summary.json").exists()}
        return _write(out, todo, results, failed, meta)

    def one(row: Row) -> None:
        try:
            result = run_row(row, out, timeout=4 * 3600)
        except Exception as e:  # noqa: BLE001 - a failed run is reported, the others go on
            with lock:
                failed.append(f"{row.key} ({str(e).splitlines()[0]})")
        else:
            with lock:
                results[row.key] = result
        with lock:
            _write(out, todo, results, failed, meta)

    from rich.progress import Progress

    with Progress() as bar, ThreadPoolExecutor(jobs) as pool:
        task = bar.add_task(f"bench quality ({len(todo)} runs, {jobs} at a time)", total=len(todo))
        for _ in pool.map(lambda r: (one(r), bar.advance(task)), todo):
            pass
    data = _write(out, todo, results, failed, meta)
    if failed:
        raise RuntimeError(f"{len(failed)} benchmark runs failed: {'; '.join(failed)}")
    return data


def _write(out: Path, todo: list[Row], results: dict[str, dict], failed: list[str], meta: dict) -> dict:
    done = [results[r.key] for r in todo if r.key in results]
    lines = aggregate(done)
    failed_keys = {f.split(" ")[0] for f in failed}
    pending = [r.key for r in todo if r.key not in results and r.key not in failed_keys]
    data = {"meta": meta, "lines": lines, "targets": targets(lines), "pending": pending, "failed": failed,
            "runs": done}
    write_json(out / "results.json", data)
    (out / "report.md").write_text(report_markdown(lines, meta, pending, failed))
    if done:
        plots(done, lines, out)
    return data
