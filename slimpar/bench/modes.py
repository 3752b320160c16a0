"""``slimpar bench modes``: every parallel mode eager in fp32, compiled (``train.compile``, inductor) and in bf16
(``train.dtype``), side by side on this machine's CPU.

Each mode is a group of three rows that train the same model on the same tokens; the report gives, per mode,
the compiled run's step time over the eager run's and the bf16 run's memory and loss against fp32's. Step-time
ratios come from interleaved timing rounds (bench/timing.py: every row again, in a rotated order) so that a slow
stretch of the shared machine falls on different rows; a compiled run's first steps compile (minutes on a CPU)
and are left out with the warm-up. Memory is the trainer's exact accounting of the instrumented step (parameters,
gradients, optimizer state, activations saved for backward), which load does not move.

The SDP and MAPL benchmarks (bench sdp, bench mapl) compare methods against DDP and the uncompressed pipeline;
these tables compare each mode against itself, so they live here, one run for all modes.
"""

from __future__ import annotations

from pathlib import Path

from slimpar.bench.report import commits_note, fmt, markdown_table, metadata, run_commits, write_json
from slimpar.bench.runner import Row, run_rows, select_rows
from slimpar.bench.timing import ratio_cell, step_time_ratios, timing_note, timing_rounds

CONFIG = "configs/llama_small.toml"
SDP = ["--parallel.mode", "sdp", "--parallel.workers", "4"]
PIPE = ["--parallel.mode", "pipeline", "--parallel.workers", "4", "--pipeline.stages", "4",
        "--model.tie_embeddings", "false"]
MODES = {
    "DDP": ["--parallel.mode", "ddp", "--parallel.workers", "4"],
    "FSDP2": ["--parallel.mode", "fsdp", "--parallel.workers", "4"],
    "B-SDP 0.5": [*SDP, "--sdp.keep", "0.5"],
    "Bb-SDP 0.5": [*SDP, "--sdp.keep", "0.5", "--sdp.regime", "backward"],
    "N-SDP 0.5": [*SDP, "--sdp.keep", "0.5", "--sdp.level", "neuron"],
    "virtual B-SDP 0.5": ["--parallel.mode", "sdp", "--sdp.virtual", "true", "--sdp.keep", "0.5"],
    "batched Bb-SDP 0.5": ["--parallel.mode", "sdp", "--sdp.virtual", "true", "--sdp.virtual_batched", "true",
                           "--sdp.keep", "0.5", "--sdp.regime", "backward"],
    "pipeline (none)": [*PIPE, "--pipeline.codec", "none"],
    "MAPL 4x": [*PIPE, "--pipeline.codec", "mapl", "--pipeline.compression", "4"],
    "MAPL 16x + RVQ": [*PIPE, "--pipeline.codec", "mapl", "--pipeline.compression", "16",
                       "--pipeline.rvq.levels", "2", "--pipeline.rvq.codebook", "256"],
    "SSN 4x": [*PIPE, "--pipeline.codec", "ssn", "--pipeline.compression", "4"],
    "pipeline x SDP": ["--parallel.mode", "pipeline", "--parallel.workers", "4", "--pipeline.stages", "2",
                       "--pipeline.dp", "sdp", "--model.tie_embeddings", "false", "--pipeline.codec", "mapl"],
}
VARIANTS = {"eager": [], "compiled": ["--train.compile", "true"], "bf16": ["--train.dtype", "bf16"]}
QUICK = ("DDP", "B-SDP 0.5", "MAPL 4x")


def rows(quick: bool, steps: int) -> list[Row]:
    base = ["--train.steps", str(10 if quick else steps), "--data.ood", "none"]
    modes = {m: MODES[m] for m in QUICK} if quick else MODES
    return [Row(v, CONFIG, base + opts + extra, mode) for mode, opts in modes.items() for v, extra in VARIANTS.items()]


def lines(results: list[dict], ratios: dict) -> list[dict]:
    by = {(r["group"], r["row"]): r["summary"] for r in results if not r["timing_round"]}
    out = []
    for mode in dict.fromkeys(r["group"] for r in results):
        eager, bf16 = by.get((mode, "eager"), {}), by.get((mode, "bf16"), {})
        out.append({"mode": mode, "compiled_vs_eager": ratios.get((mode, "compiled")),
                    "bf16_vs_eager": ratios.get((mode, "bf16")),
                    **{f"{v}_{k}": by.get((mode, v), {}).get(k) for v in VARIANTS
                       for k in ("val_loss", "step_time_s", "peak_mem_bytes")},
                    "fp32_activation_bytes": _activations(eager), "bf16_activation_bytes": _activations(bf16)})
    return out


def _activations(summary: dict):
    parts = summary.get("mem_breakdown") or {}
    return parts.get("activations")


def _mib(b) -> str:
    return fmt(b / 2**20, 1) if b is not None else "–"


def report_markdown(table: list[dict], meta: dict) -> str:
    compile_rows = [[ln["mode"], fmt(ln["eager_step_time_s"], 3), fmt(ln["compiled_step_time_s"], 3),
                     ratio_cell(ln["compiled_vs_eager"]), fmt(ln["eager_val_loss"], 4), fmt(ln["compiled_val_loss"], 4)]
                    for ln in table]
    bf16_rows = [[ln["mode"], _mib(ln["eager_peak_mem_bytes"]), _mib(ln["bf16_peak_mem_bytes"]),
                  _mib(ln["fp32_activation_bytes"]), _mib(ln["bf16_activation_bytes"]), fmt(ln["eager_val_loss"], 4),
                  fmt(ln["bf16_val_loss"], 4), ratio_cell(ln["bf16_vs_eager"])] for ln in table]
    head = (f"# slimpar bench modes\n\nMeasured {meta['date']} on {meta['machine']} ({meta['cpus']} CPUs), commit "
            f"`{meta['git_commit']}`, torch {meta['versions']['torch']}; {CONFIG}, {meta['steps']} steps a row.\n\n")
    compile_t = markdown_table(["mode", "eager step (s)", "compiled step (s)", "compiled / eager, median [range]",
                                "eager val loss", "compiled val loss"], compile_rows)
    bf16_t = markdown_table(["mode", "fp32 peak / worker (MiB)", "bf16 peak (MiB)", "fp32 activations (MiB)",
                             "bf16 activations (MiB)", "fp32 val loss", "bf16 val loss", "bf16 / fp32 step time"],
                            bf16_rows)
    timing = timing_note(meta["timing"], meta["timing_rounds"], "6") if meta.get("timing") else ""
    return (head + commits_note(meta) + "## torch.compile (inductor) against eager\n\n" + compile_t + "\n\n"
            + "## bf16 autocast against fp32\n\n" + bf16_t + "\n\n" + timing)


def bench_modes(out: Path, quick: bool, steps: int = 30, only: set[str] | None = None, rounds: int = 2) -> dict:
    """Every mode's three rows, then ``rounds`` interleaved timing rounds; results.json, report.md."""
    todo = select_rows(rows(quick, steps), only)
    out.mkdir(parents=True, exist_ok=True)
    results = run_rows(todo, out)
    timings = timing_rounds(todo, rounds, out)
    ratios = step_time_ratios(results, timings, "eager")
    table = lines(results, ratios)
    meta = metadata({"quick": quick, "steps": 10 if quick else steps, "timing_rounds": rounds,
                     "run_commits": run_commits(results + timings)})
    meta["timing"] = {f"{g}/{n}": v for (g, n), v in ratios.items()} if rounds else None
    data = {"meta": meta, "lines": table, "runs": results, "timing_runs": timings}
    write_json(out / "results.json", data)
    (out / "report.md").write_text(report_markdown(table, meta))
    return data
