"""``slimpar bench modes``: every parallel mode eager in fp32, compiled (``train.compile``, inductor) and in bf16
(``train.dtype``), side by side on this machine's CPU.

Each mode is a group of three rows that train the same model on the same tokens; the report gives, per mode,
the compiled run's step time over the eager run's and the bf16 run's memory and loss against fp32's. Compiled
against eager step-time ratios come from interleaved timing rounds (benchmarks/timing.py: the eager and compiled rows
again, in a rotated order) so that a slow stretch of the shared machine falls on different rows; a compiled run's
first steps compile (minutes on a CPU) and are left out with the warm-up. Memory is the trainer's exact accounting
of the instrumented step (parameters, gradients, optimizer state, activations saved for backward), which load does
not move.

bf16 runs only ``BF16_STEPS`` steps: this CPU has no bf16 matrix units, so a bf16 step takes 6-13x an fp32 one
(measured, the table's last column), and a full-length bf16 row would cost most of the benchmark's time. Its loss is
compared with the fp32 eager run's train loss at the same step (both log every step, on the same batches), and its
memory comes from the same instrumented step as fp32's.

The SDP and MAPL benchmarks (bench sdp, bench mapl) compare methods against DDP and the uncompressed pipeline;
these tables compare each mode against itself, so they live here, one run for all modes.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.plots import modes_plot
from benchmarks.report import COMPRESSION_NOTE, commits_note, fmt, markdown_table, metadata, run_commits, write_json
from benchmarks.runner import Row, run_rows, select_rows
from benchmarks.timing import ratio_cell, step_time_ratios, timing_note, timing_rounds

CONFIG = "configs/llama_small.toml"
SDP = ["--parallel.mode", "sdp", "--parallel.workers", "4"]
VIRTUAL = ["--parallel.mode", "sdp", "--parallel.workers", "1", "--sdp.virtual", "true", "--sdp.virtual_workers", "4"]
PIPE = ["--parallel.mode", "pipeline", "--parallel.workers", "4", "--pipeline.stages", "4",
        "--model.tie_embeddings", "false"]
# the pipeline rows were measured with r = d / K, the default before pipeline.compression_of became "total"
_PAYLOAD = ("--pipeline.compression_of", "payload")
MODES = {
    "DDP": ["--parallel.mode", "ddp", "--parallel.workers", "4"],
    "FSDP2": ["--parallel.mode", "fsdp", "--parallel.workers", "4"],
    "B-SDP 0.5": [*SDP, "--sdp.keep", "0.5"],
    "Bb-SDP 0.5": [*SDP, "--sdp.keep", "0.5", "--sdp.regime", "backward"],
    "N-SDP 0.5": [*SDP, "--sdp.keep", "0.5", "--sdp.level", "neuron"],
    "virtual B-SDP 0.5": [*VIRTUAL, "--sdp.keep", "0.5"],
    "batched Bb-SDP 0.5": [*VIRTUAL, "--sdp.virtual_batched", "true", "--sdp.keep", "0.5", "--sdp.regime", "backward"],
    "pipeline (none)": [*PIPE, "--pipeline.codec", "none"],
    "MAPL 4x": [*PIPE, "--pipeline.codec", "mapl", "--pipeline.compression", "4", *_PAYLOAD],
    "MAPL 16x + RVQ": [*PIPE, "--pipeline.codec", "mapl", "--pipeline.compression", "16",
                       "--pipeline.rvq.levels", "2", "--pipeline.rvq.codebook", "256", *_PAYLOAD],
    "SSN 4x": [*PIPE, "--pipeline.codec", "ssn", "--pipeline.compression", "4", *_PAYLOAD],
    "pipeline x SDP": ["--parallel.mode", "pipeline", "--parallel.workers", "4", "--pipeline.stages", "2",
                       "--pipeline.dp", "sdp", "--model.tie_embeddings", "false", "--pipeline.codec", "mapl",
                       *_PAYLOAD],
}
VARIANTS = {"eager": [], "compiled": ["--train.compile", "true"], "bf16": ["--train.dtype", "bf16"]}
QUICK = ("DDP", "B-SDP 0.5", "MAPL 4x")
BF16_STEPS = 3  # the instrumented step 2 and one step after it; its loss is compared at this step


def rows(quick: bool, steps: int) -> list[Row]:
    base = ["--data.ood", "none", "--log.every", "1"]
    modes = {m: MODES[m] for m in QUICK} if quick else MODES
    length = {v: BF16_STEPS if v == "bf16" else (10 if quick else steps) for v in VARIANTS}
    return [Row(v, CONFIG, base + opts + ["--train.steps", str(length[v])] + extra, mode)
            for mode, opts in modes.items() for v, extra in VARIANTS.items()]


def timed(todo: list[Row]) -> list[Row]:
    """The rows that timing rounds rerun: eager and compiled (bf16's CPU step time is reported from its own run)."""
    return [r for r in todo if r.name != "bf16"]


def lines(results: list[dict], ratios: dict) -> list[dict]:
    runs = {(r["group"], r["row"]): r for r in results if not r["timing_round"]}
    by = {k: r["summary"] for k, r in runs.items()}
    out = []
    for mode in dict.fromkeys(r["group"] for r in results):
        eager, bf16 = by.get((mode, "eager"), {}), by.get((mode, "bf16"), {})
        out.append({"mode": mode, "compiled_vs_eager": ratios.get((mode, "compiled")),
                    "bf16_vs_eager": ratios.get((mode, "bf16")),
                    **{f"{v}_{k}": by.get((mode, v), {}).get(k) for v in VARIANTS
                       for k in ("val_loss", "step_time_s", "peak_mem_bytes")},
                    "fp32_activation_bytes": _activations(eager), "bf16_activation_bytes": _activations(bf16),
                    "fp32_loss_at_bf16_steps": _loss_at(runs.get((mode, "eager")), BF16_STEPS),
                    "bf16_loss_at_bf16_steps": _loss_at(runs.get((mode, "bf16")), BF16_STEPS)})
    return out


def _loss_at(run: dict | None, step: int):
    """The train loss a run logged at ``step`` (None when it did not log that step)."""
    found = [c["loss"] for c in (run or {}).get("curve", []) if c.get("step") == step and "loss" in c]
    return found[-1] if found else None


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
                  _mib(ln["fp32_activation_bytes"]), _mib(ln["bf16_activation_bytes"]),
                  fmt(ln["fp32_loss_at_bf16_steps"], 4), fmt(ln["bf16_loss_at_bf16_steps"], 4),
                  _diff(ln["fp32_loss_at_bf16_steps"], ln["bf16_loss_at_bf16_steps"]), ratio_cell(ln["bf16_vs_eager"])]
                 for ln in table]
    head = (f"# slimpar bench modes\n\nMeasured {meta['date']} on {meta['machine']} ({meta['cpus']} CPUs), commit "
            f"`{meta['git_commit']}`, torch {meta['versions']['torch']}; {CONFIG}, {meta['steps']} steps an eager or "
            f"compiled row, {BF16_STEPS} a bf16 row.\n\n{COMPRESSION_NOTE}\n\n")
    compile_t = markdown_table(["mode", "eager step (s)", "compiled step (s)", "compiled / eager, median [range]",
                                "eager val loss", "compiled val loss"], compile_rows)
    bf16_t = markdown_table(["mode", "fp32 peak / worker (MiB)", "bf16 peak (MiB)", "fp32 activations (MiB)",
                             "bf16 activations (MiB)", f"fp32 train loss, step {BF16_STEPS}",
                             f"bf16 train loss, step {BF16_STEPS}", "bf16 − fp32", "bf16 / fp32 step time (one run)"],
                            bf16_rows)
    timing = timing_note(meta["timing"], meta["timing_rounds"], "6") if meta.get("timing") else ""
    return (head + commits_note(meta) + "## torch.compile (inductor) against eager\n\n" + compile_t + "\n\n"
            + "## bf16 autocast against fp32\n\n" + BF16_NOTE + bf16_t + "\n\n" + timing)


BF16_NOTE = (f"bf16 rows run {BF16_STEPS} steps (a CPU bf16 step is slow: last column, the step after warm-up of one "
             f"run each); their train loss is compared with the fp32 eager run's at step {BF16_STEPS}, on the same "
             "batches. Memory: the instrumented step, exact accounting.\n\n")


def _diff(a, b) -> str:
    return f"{b - a:+.4f}" if a is not None and b is not None else "–"


def bench_modes(out: Path, quick: bool, steps: int = 10, only: set[str] | None = None, rounds: int = 2) -> dict:
    """Every mode's three rows, then ``rounds`` interleaved timing rounds of its eager and compiled rows;
    results.json, report.md, modes.png."""
    todo = select_rows(rows(quick, steps), only)
    out.mkdir(parents=True, exist_ok=True)
    results = run_rows(todo, out)
    timings = timing_rounds(timed(todo), rounds, out)
    ratios = step_time_ratios(results, timings, "eager")
    table = lines(results, ratios)
    meta = metadata({"quick": quick, "steps": 10 if quick else steps, "timing_rounds": rounds,
                     "run_commits": run_commits(results + timings)})
    meta["timing"] = {f"{g}/{n}": v for (g, n), v in ratios.items()} if rounds else None
    data = {"meta": meta, "lines": table, "runs": results, "timing_runs": timings}
    write_json(out / "results.json", data)
    (out / "report.md").write_text(report_markdown(table, meta))
    modes_plot(table, out / "modes.png")
    return data
