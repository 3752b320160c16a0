"""``slimpar bench ops --out DIR``: aten ops per training step of a 4-stage virtual pipeline, by codec and model size.

Every aten op is a dispatcher call on a CPU and one kernel launch or more on a GPU, where a small model's eager
step is bound by launches, not arithmetic; the count does not depend on the machine, its load or the batch, so it
is the CPU's stand-in for a codec's cost on a GPU. Each row is counted in two ``slimpar train`` runs in fresh
processes on ``configs/llama_small.toml`` at a model size (``--model.size``), batch 4 x 64: the instrumented step's
count (summary.json ``per_rank[0].aten_ops``; the forward, the backward, the gradient exchange, the clip and the
optimizer) at step 1 in one and at step 2 in the other (``log.measure_step``; step 0 is a warm-up, where RVQ starts
its codebooks by k-means). RVQ updates its codebooks every second step (``rvq.update_every`` 2), so its two steps
differ and their mean is its cost a step (the full codebook push every ``rvq.sync_every`` = 50 steps aside); every
other row's two counts are equal. The rows:

- ``single``: one process training the model (``--parallel.mode single``);
- ``virtual pipeline, none``: its blocks as 4 stages in one process, 4 microbatches in one pass, no codec;
- ``MAPL 4x`` and ``MAPL 16x + RVQ``: the same with MAPL at every boundary (r = d / K of the payload; RVQ with 2
  levels);
- ``microbatched, none`` and ``microbatched, MAPL 4x``: the virtual pipeline's microbatched schedule
  (``--pipeline.virtual_microbatched true``), each microbatch through every stage in turn, as P processes order
  the work: what one pass saves.

A row's ratio (of the mean over its two steps) is to its reference's (none's to single, a codec's to none), set
against the goal where there is one
(:data:`GOALS`). The codec's ops are per boundary, not per block, so the ratio falls as the stages deepen: the
table has the tiny model (1 block a stage), ``small`` (2) and 134M (3). tests/distributed/test_virtual_pipeline_ops.py
holds the budgets on the same rows (:func:`row_args`).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.report import COMPRESSION_NOTE, markdown_table, metadata, write_json
from benchmarks.runner import Row, run_row
from benchmarks.throughput import TRAIN_ROWS
from slimpar.models.llama import LlamaConfig

SIZES = ("tiny", "small", "134m")
STAGES = 4  # as the rows say (--pipeline.stages)
MEASURED = (1, 2)  # the steps counted, one run each: a whole RVQ update cycle
TRAIN = ["--eval.batches", "1", "--data.ood", "none", "--checkpoint.export", "false", "--checkpoint.final", "false",
         "--checkpoint.every", "0"]
BATCH = ["--train.batch_size", "4", "--data.seq_len", "64", "--eval.batch_size", "4"]  # the count does not vary
MICROBATCHED = ["--pipeline.virtual_microbatched", "true"]  # each microbatch through every stage in turn
# the pipeline rows are slimpar bench throughput's (4 stages, 4 microbatches), counted here at three sizes
ROWS = {"single": ["--parallel.mode", "single", "--parallel.workers", "1"],
        "virtual pipeline, none": TRAIN_ROWS["virtual pipeline, none"],
        "MAPL 4x": TRAIN_ROWS["virtual pipeline, MAPL 4x"],
        "MAPL 16x + RVQ": TRAIN_ROWS["virtual pipeline, MAPL 16x + RVQ"],
        "microbatched, none": [*TRAIN_ROWS["virtual pipeline, none"], *MICROBATCHED],
        "microbatched, MAPL 4x": [*TRAIN_ROWS["virtual pipeline, MAPL 4x"], *MICROBATCHED]}
REFERENCE = {"virtual pipeline, none": "single", "MAPL 4x": "virtual pipeline, none",
             "MAPL 16x + RVQ": "virtual pipeline, none", "microbatched, none": "single",
             "microbatched, MAPL 4x": "microbatched, none"}
GOALS = {"virtual pipeline, none": 1.15, "MAPL 4x": 1.05,  # x the reference's ops (docs/pipeline.md)
         "microbatched, MAPL 4x": 1.05}
CONFIG = "llama_small.toml"


def row_args(size: str, name: str, step: int = 1) -> list[str]:
    """The overrides of row ``name`` at model ``size``, counting step ``step`` (after ``--config
    configs/llama_small.toml``)."""
    return ["--train.steps", str(step + 1), "--log.measure_step", str(step), *TRAIN, "--model.size", size, *BATCH,
            *ROWS[name]]


def bench_ops(out: Path, sizes: tuple[str, ...] = SIZES) -> dict:
    """Every row at every size, one run each; results.json and report.md in ``out``, rewritten after each size."""
    meta = metadata({"config": CONFIG, "stages": STAGES, "batch": "4 x 64", "device": "cpu"})
    counts: dict[str, dict[str, list[int]]] = {}
    for size in sizes:
        counts[size] = {}
        for name in ROWS:
            print(f"[ops] {size}: {name} ...", flush=True)
            counts[size][name] = [run_row(Row(name, CONFIG, row_args(size, name, step), group=f"ops-{size}-step{step}"),
                                          out)["summary"]["per_rank"][0]["aten_ops"] for step in MEASURED]
        data = {"meta": meta, "lines": lines_of(counts)}
        write_json(out / "results.json", data)
        (out / "report.md").write_text(report_markdown(data["lines"], meta))
    print(json.dumps({f"{ln['size']} / {ln['row']}": ln["aten_ops_by_step"] for ln in data["lines"]}))
    return data


def lines_of(counts: dict[str, dict[str, list[int]]]) -> list[dict]:
    """One line per (size, row): its ops at each measured step and their mean, the mean's ratio to its reference's,
    the goal and whether it is met."""
    lines = []
    for size, rows in counts.items():
        blocks = LlamaConfig.named(size).n_layers
        mean = {name: sum(ops) / len(ops) for name, ops in rows.items()}
        for name, ops in rows.items():
            ref = REFERENCE.get(name)
            ratio = mean[name] / mean[ref] if ref in rows else None
            goal = GOALS.get(name)
            lines.append({"size": size, "blocks_per_stage": blocks / STAGES, "row": name,
                          "aten_ops_by_step": dict(zip(map(str, MEASURED), ops, strict=True)), "aten_ops": mean[name],
                          "reference": ref, "ratio": ratio, "goal": goal,
                          "met": None if goal is None or ratio is None else ratio <= goal,
                          "command": f"slimpar train --config configs/{CONFIG} " + " ".join(row_args(size, name)),
                          "steps_counted": "log.measure_step " + ", ".join(map(str, MEASURED))})
    return lines


def report_markdown(lines: list[dict], meta: dict) -> str:
    cells = [[ln["size"], f"{ln['blocks_per_stage']:g}", ln["row"],
              *(f"{n:,}" for n in ln["aten_ops_by_step"].values()), _count(ln["aten_ops"]),
              "–" if ln["ratio"] is None else f"{ln['ratio']:.3f}x {_short(ln['reference'])}",
              "–" if ln["goal"] is None else f"≤ {ln['goal']:.2f}x: {'met' if ln['met'] else 'missed'}"]
             for ln in lines]
    table = markdown_table(["model", "blocks a stage", "row", *(f"aten ops, step {k}" for k in MEASURED), "mean",
                            "ratio (mean)", "goal"], cells)
    commands = "\n".join(f"- {ln['size']}, {ln['row']}: `{ln['command']}`" for ln in lines)
    return (f"# slimpar bench ops\n\nCounted {meta['date']} on the CPU, commit `{meta['git_commit']}`, torch "
            f"{meta['versions']['torch']}: the instrumented step's aten ops (summary.json `per_rank[0].aten_ops`) "
            f"at steps 1 and 2, one `slimpar train` run each (the commands below count step 1; "
            "`--train.steps 3 --log.measure_step 2` counts step 2), "
            f"`configs/{CONFIG}` at the model size named, batch {meta['batch']} (the count does not depend on it), "
            f"{meta['stages']} stages and 4 microbatches in one pass for the pipeline rows. RVQ updates its codebooks "
            "at every second step, so its mean over the two is its cost a step; the other rows count the same at both. "
            "A codec adds the same ops at every boundary whatever a stage holds, so its ratio falls as the stages "
            "deepen (benchmarks/ops.py).\n\n"
            f"{COMPRESSION_NOTE}\n\n{table}\n\nCommands:\n\n{commands}\n")


def _count(n: float) -> str:
    return f"{n:,.0f}" if n == int(n) else f"{n:,.1f}"


def _short(name: str) -> str:
    return {"virtual pipeline, none": "none", "microbatched, none": "microbatched none"}.get(name, name)
