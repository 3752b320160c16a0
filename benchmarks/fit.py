"""``slimpar bench fit``: ``slimpar plan --fit``'s predictions against runs on this machine's throttled links.

The cluster: two "nodes" of 2 workers each (benchmarks.network.nodes: two network namespaces, the link
between them limited with ``tbf`` both ways, loopback inside a node), at 1000, 100 and 10 Mbit/s. The model:
configs/llama_tiny.toml. The candidates: seven of the planner's own grid for 4 workers (DDP, FSDP2, B-SDP 1/2
alone and with 2-way FSDP2, the 4-stage pipeline with codec none, MAPL 4x and MAPL 16x + RVQ), each run
with exactly the planner's overrides (benchmarks.network.wallclock.run_one: median step after warm-up).

The compute rate is calibrated once, from a run that is none of the measured ones: DDP on 4 local workers
over loopback (no throttling), whose step is compute-bound; its FLOPs per worker over its step time give the
cluster's achieved FLOP/s (``--cluster.tflops`` at MFU 1). Every prediction then comes from the planner alone:
bytes from its traffic model, memory from its fake-tensor step. Reported per rate: the step-time error of every
candidate, Kendall's tau between the predicted and the measured ranking, and the memory error (the runs' own
accounting at the step they instrument against the prediction).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks.report import fmt, markdown_table, metadata, write_json
from benchmarks.runner import CONFIGS

RATES = (1000.0, 100.0, 10.0)
ROWS = ("DDP", "FSDP2", "B-SDP 1/2", "B-SDP 1/2 + FSDP2 2", "pipeline 4 x 1, none", "pipeline 4 x 1, MAPL 4x",
        "pipeline 4 x 1, MAPL 16x + RVQ")
QUICK_ROWS = ROWS[:2] + ROWS[4:6]
TARGETS = {"median_step_error": 0.25, "kendall_tau": 0.7, "memory_error": 0.05}


def _base():
    from slimpar.config import load_config

    return load_config(CONFIGS / "llama_tiny.toml")


def _cluster(rate: float, tflops: float):
    from slimpar.plan.cluster import ClusterConfig, resolve_cluster

    return resolve_cluster(ClusterConfig(preset="this", nodes=2, gpus_per_node=2, gpu_memory="4GiB",
                                         intra_gbps=10.0, inter_gbps=rate / 1000, tflops=tflops, mfu=1.0))


def calibrate(out: Path) -> dict:
    """Achieved FLOP/s per worker from a local, unthrottled 4-worker DDP run (module docstring)."""
    from benchmarks.network.wallclock import TIMING
    from benchmarks.runner import Row, run_row
    from slimpar.config import with_overrides
    from slimpar.plan.workload import workload

    overrides = ["--parallel.mode", "ddp", "--parallel.workers", "4", "--train.steps", "10", *TIMING]
    run = run_row(Row("calibration DDP x 4, loopback", "llama_tiny.toml", overrides, group="fit"), out)
    step = run["summary"]["step_time_s"]
    cfg = with_overrides(_base(), ["--parallel.mode", "ddp", "--parallel.workers", "4"])
    w = workload(cfg, _cluster(1000.0, 1.0))
    flops = w.fwd + w.bwd
    return {"step_time_s": step, "flops_per_worker": flops, "tflops": flops / step / 1e12,
            "command": run["command"]}


def _predict(rows: tuple[str, ...], rate: float, tflops: float) -> dict:
    from slimpar.plan.fit import FitConfig, fit

    fc = FitConfig(candidates=",".join(rows), jobs=2)
    scored = fit(_base(), _cluster(rate, tflops), fc)
    return {r.candidate.name: r for r in scored if r.candidate.name in rows}


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b between two score lists (scipy.stats.kendalltau)."""
    from scipy.stats import kendalltau

    return float(kendalltau(a, b).statistic)


def _measure(name: str, overrides: tuple[str, ...], rate: float, out: Path) -> dict:
    from benchmarks.network.wallclock import STEPS, run_one

    line = run_one("fit", name, list(overrides), rate, STEPS[rate], out)
    run_dir = out / "runs" / f"fit-{name}-{rate:g}mbit".replace(" ", "_").replace("+", "p").replace(".", "_")
    summary = json.loads((run_dir / "summary.json").read_text())
    line["peak_by_rank"] = {i: r["mem"]["peak_live"] for i, r in enumerate(summary["per_rank"])}
    return line


def bench_fit(out: Path, quick: bool = False) -> dict:
    """The sweep (finished runs under ``out/runs`` are reused), results.json, report.md and fit.png."""
    out.mkdir(parents=True, exist_ok=True)
    rows = QUICK_ROWS if quick else ROWS
    rates = RATES[1:] if quick else RATES
    cal = calibrate(out)
    lines = []
    for rate in rates:
        predicted = _predict(rows, rate, cal["tflops"])
        for name in rows:
            p = predicted[name]
            m = _measure(name, p.candidate.overrides, rate, out)
            mem_err = [abs(p.peaks[k] - m["peak_by_rank"][k]) / m["peak_by_rank"][k] for k in p.peaks]
            lines.append({"row": name, "rate_mbit": rate, "predicted_step_s": p.step_s,
                          "measured_step_s": m["step_time_s"], "predicted_inter_bytes": p.bytes_inter,
                          "measured_inter_bytes": m["bytes_per_step"],
                          "step_error": p.step_s / m["step_time_s"] - 1, "memory_error_max": max(mem_err),
                          "predicted_peak_by_rank": p.peaks, "measured_peak_by_rank": m["peak_by_rank"]})
    per_rate = {}
    for rate in rates:
        ls = [ln for ln in lines if ln["rate_mbit"] == rate]
        per_rate[f"{rate:g}"] = {"kendall_tau": kendall_tau([ln["predicted_step_s"] for ln in ls],
                                                            [ln["measured_step_s"] for ln in ls]),
                                 "median_step_error": statistics.median(abs(ln["step_error"]) for ln in ls)}
    summary = {"median_step_error": statistics.median(abs(ln["step_error"]) for ln in lines),
               "kendall_tau_min": min(v["kendall_tau"] for v in per_rate.values()),
               "memory_error_max": max(ln["memory_error_max"] for ln in lines), "targets": TARGETS}
    data = {"meta": metadata({"quick": quick, "rates_mbit": list(rates), "rows": list(rows),
                              "loadavg_1m_at_end": __import__("os").getloadavg()[0]}),
            "calibration": cal, "lines": lines, "per_rate": per_rate, "summary": summary}
    write_json(out / "results.json", data)
    (out / "report.md").write_text(report(data))
    plot(lines, out / "fit.png")
    return data


def report(data: dict) -> str:
    m, s, cal = data["meta"], data["summary"], data["calibration"]
    head = (f"# slimpar bench fit\n\nMeasured {m['date']} on {m['machine']} ({m['cpus']} CPUs), commit "
            f"`{m['git_commit']}`, torch {m['versions']['torch']}. `slimpar plan --fit`'s predictions for "
            "configs/llama_tiny.toml on two \"nodes\" of 2 gloo workers (network namespaces; the link between them "
            "limited with tbf both ways, loopback inside a node) against runs of the same candidates there. Compute "
            f"rate calibrated once from a local unthrottled DDP x 4 run: {cal['step_time_s']:.4f} s a step, "
            f"{cal['tflops'] * 1e3:.3g} GFLOP/s per worker. Load average at the end: {m['loadavg_1m_at_end']:.1f}."
            "\n\n")
    rows = [[ln["row"], f"{ln['rate_mbit']:g}", fmt(ln["predicted_step_s"], 3), fmt(ln["measured_step_s"], 3),
             f"{100 * ln['step_error']:+.0f}%", fmt(ln["predicted_inter_bytes"], 0),
             fmt(ln["measured_inter_bytes"], 0), f"{100 * ln['memory_error_max']:.2f}%"] for ln in data["lines"]]
    table = markdown_table(["candidate", "Mbit/s", "predicted step (s)", "measured step (s)", "error",
                            "predicted inter-node bytes/step", "measured (veth, busier way)", "memory error"], rows)
    rates = markdown_table(["Mbit/s", "Kendall tau", "median |step error|"],
                           [[k, f"{v['kendall_tau']:.2f}", f"{100 * v['median_step_error']:.0f}%"]
                            for k, v in data["per_rate"].items()])
    t = s["targets"]
    verdict = (f"\n\nTargets: median step-time error {100 * s['median_step_error']:.0f}% (target <= "
               f"{100 * t['median_step_error']:.0f}%), smallest Kendall tau {s['kendall_tau_min']:.2f} (target >= "
               f"{t['kendall_tau']}), largest memory error {100 * s['memory_error_max']:.2f}% (target <= "
               f"{100 * t['memory_error']:.0f}%).\n")
    return head + table + "\n\n" + rates + verdict


def plot(lines: list[dict], path: Path) -> None:
    from benchmarks.plots import _plt

    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for i, rate in enumerate(sorted({ln["rate_mbit"] for ln in lines}, reverse=True)):
        ls = [ln for ln in lines if ln["rate_mbit"] == rate]
        ax.scatter([ln["measured_step_s"] for ln in ls], [ln["predicted_step_s"] for ln in ls], color=f"C{i}",
                   label=f"{rate:g} Mbit/s")
    lo = min(min(ln["measured_step_s"], ln["predicted_step_s"]) for ln in lines) * 0.8
    hi = max(max(ln["measured_step_s"], ln["predicted_step_s"]) for ln in lines) * 1.25
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("plan --fit's predicted step time (s)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
