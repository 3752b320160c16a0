"""``slimpar bench throughput``: how much of ``torch.compile``'s gain the trainer keeps, on one device.

Four rows train the same LLaMA shape (untied head) on one device, bf16 autocast and fused AdamW on a GPU (fp32 on
a CPU, which has no bf16 matrix units):

- ``plain eager`` / ``plain compiled``: a reference loop over slimpar's ``Llama`` (forward, cross-entropy, backward,
  AdamW), eager and with every block compiled (``slimpar.parallel.compile.apply_compile``), in this process; on a
  GPU also ``plain compiled, CUDA graphs``: the blocks compiled with ``mode="reduce-overhead"`` (inductor's CUDA
  graph trees, each step opened by ``torch.compiler.cudagraph_mark_step_begin``), which says whether CUDA graphs
  pay at this size before the trainer offers them;
- ``train eager`` / ``train compiled``: ``slimpar train --parallel.mode single`` in a fresh process, without and with
  ``--train.compile true`` (``train compiled, loss`` adds ``--train.compile_scope loss``);
- ``virtual pipeline, none`` / ``MAPL 4x`` / ``MAPL 16x + RVQ``: the same model as a 4-stage virtual pipeline (one
  process, 4 microbatches in one pass), eager: what the stages and each codec cost next to ``train eager``.
- ``MAPL boundary step``: one MAPL 4x boundary at the model's width and the batch's tokens, alone, in this process
  (benchmarks/boundary.py: both halves' forward and backward, one SPEL step); its ratio is to the whole model's
  plain compiled step, and it has no MFU (not a model step).

A row that raises is recorded with its error (``"error"``, no numbers) and the next row runs; results.json and
report.md are rewritten after every row, so a run cut short (the device check's time limit) keeps its finished
rows. Step time is the median over the steps after the warm-up (compilation happens there): on a GPU each plain step
ends with ``torch.cuda.synchronize``, and the trainer synchronizes each step itself (its metrics.jsonl). The
trainer's instrumented step (``log.measure_step``, the third) falls inside the warm-up. ``ratio`` is a row's step
time over the plain compiled loop's. Without ``--quick`` every row runs in 3 rounds, one round after another and the
rows' order rotated by one each round (benchmarks/timing.py's way): on a shared CPU, runs minutes apart differ by
tens of percent, so a row's ratio is taken to the plain compiled loop of its own round, and reported as the median
[min–max] over the rounds, its step time as the median. ``--quick`` (the device check) runs one round. Aten ops per
step: a plain step after the warm-up under ``SyncCounter``; a trainer row's instrumented step (summary.json's
``per_rank[0].aten_ops``). Both run eager, compiled rows included
(dynamo steps aside under a dispatch mode), so they count the eager step's ops, not a compiled step's kernels.
MFU: ``slimpar.parallel.flops``.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.boundary import boundary_row
from benchmarks.in_process import time_steps
from benchmarks.report import COMPRESSION_NOTE, fmt, markdown_table, metadata, write_json
from benchmarks.runner import Row, run_row
from benchmarks.timing import ratio_cell, rotated, summarize
from slimpar.config import ConfigError
from slimpar.models.llama import Llama, LlamaConfig
from slimpar.parallel.compile import apply_compile
from slimpar.parallel.flops import llama_flops_per_token, mfu, peak_bf16


@dataclass(frozen=True)
class Shape:
    """The model and batch every row trains, and how many steps each row runs."""

    size: str
    batch: int
    seq: int
    vocab: int
    warmup: int
    steps: int  # measured steps after the warm-up
    rounds: int = 1  # every row this many times, rows interleaved (module docstring)

    @classmethod
    def of(cls, size: str, quick: bool) -> Shape:
        """``quick`` (the device check's speed part): 8 steps, one round; else 20 steps in each of 3 rounds."""
        batch, seq, vocab = BATCHES.get(size, (16, 1024, 32000))
        return cls(size, batch, seq, vocab, warmup=3, steps=8 if quick else 20, rounds=1 if quick else 3)


# (batch, sequence, vocabulary) where not 16 x 1,024 x 32k; 1B at the 2,048 its preset is made for (16k tokens too)
BATCHES = {"tiny": (8, 64, 512), "mini": (8, 64, 512), "1b": (8, 2048, 32000)}


def plain_row(shape: Shape, device: torch.device, backend: str | None, mode: str | None = None) -> dict:
    """The reference loop; ``backend`` None: eager, else every block compiled with it (and ``mode``)."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig.named(shape.size, vocab_size=shape.vocab, tie_embeddings=False,
                                    max_seq_len=max(shape.seq, 256))).to(device)
    if backend is not None:
        apply_compile(model.layers, backend, mode)
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    x = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), device=device)

    def step() -> None:
        if mode == "reduce-overhead":  # a new step: the graphs' previous outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1).float(), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return time_steps(step, shape.warmup, shape.steps, device)


PLAIN_ROWS = {"plain eager": (False, None), "plain compiled": (True, None),  # (compiled, torch.compile's mode)
              "plain compiled, CUDA graphs": (True, "reduce-overhead")}
CUDA_ONLY = ("plain compiled, CUDA graphs",)  # on a CPU inductor skips CUDA graphs: the row would repeat the one above
TRAINER_ROWS = ("train eager", "train compiled", "train compiled, loss")
PIPELINE_ROWS = ("virtual pipeline, none", "virtual pipeline, MAPL 4x", "virtual pipeline, MAPL 16x + RVQ")
BOUNDARY_ROWS = ("MAPL boundary step",)  # in-process, before the trainer rows: a device call's cheapest row first
GROUPS = {"plain": tuple(PLAIN_ROWS), "trainer": TRAINER_ROWS, "pipeline": PIPELINE_ROWS,  # --rows names them
          "boundary": BOUNDARY_ROWS}
# all 4 blocks as 4 stages in one process, 4 microbatches a step (one pass): a codec's cost next to the stages'
VIRTUAL = ["--parallel.mode", "pipeline", "--parallel.workers", "1", "--pipeline.virtual", "true",
           "--pipeline.stages", "4", "--pipeline.microbatches", "4"]
PAYLOAD = ("--pipeline.compression_of", "payload")  # r = d / K, as measured (the default then)
TRAIN_ROWS = {"train eager": [], "train compiled": ["--train.compile", "true"],  # in the order of the table
              "train compiled, loss": ["--train.compile", "true", "--train.compile_scope", "loss"],
              "virtual pipeline, none": VIRTUAL,
              "virtual pipeline, MAPL 4x": [*VIRTUAL, "--pipeline.codec", "mapl", "--pipeline.compression", "4",
                                            *PAYLOAD],
              "virtual pipeline, MAPL 16x + RVQ": [*VIRTUAL, "--pipeline.codec", "mapl", "--pipeline.compression", "16",
                                                   "--pipeline.rvq.levels", "2", *PAYLOAD]}


def train_overrides(shape: Shape, device: str, corpus: Path, backend: str) -> list[str]:
    return ["--data.corpus", "path", "--data.path", str(corpus), "--data.ood", "none", "--model.size", shape.size,
            "--model.vocab_size", str(shape.vocab), "--model.tie_embeddings", "false",
            "--model.max_seq_len", str(max(shape.seq, 256)), "--data.seq_len", str(shape.seq),
            "--train.batch_size", str(shape.batch), "--train.steps", str(shape.warmup + shape.steps),
            "--train.compile_backend", backend, "--train.dtype", "bf16" if device == "cuda" else "fp32",
            "--parallel.device", device, "--log.every", "1", "--eval.batches", "1",
            "--checkpoint.export", "false", "--checkpoint.final", "false", "--checkpoint.every", "0"]


def train_row(name: str, shape: Shape, device: str, corpus: Path, backend: str, out: Path) -> dict:
    """One trainer row in a fresh process; its step time from metrics.jsonl, after the warm-up."""
    run = run_row(Row(name, "llama_tiny.toml", train_overrides(shape, device, corpus, backend) + TRAIN_ROWS[name],
                      "throughput"), out)
    times = [c["step_time_s"] for c in run["curve"] if "step_time_s" in c and c["step"] > shape.warmup]
    s = run["summary"]
    rank = (s.get("per_rank") or [{}])[0]
    return {"step_time_s": statistics.median(times), "aten_ops": rank.get("aten_ops"),
            "host_syncs": rank.get("host_syncs"), "compile": s.get("compile"),
            "peak_mem_bytes": s.get("cuda_max_allocated_bytes") or s.get("peak_mem_bytes")}


def finish(rounds: list[dict[str, dict]], names: list[str], shape: Shape, device: torch.device) -> list[dict]:
    """Every row measured so far, in ``names``' order, over its rounds (``rounds[k][name]``): the median step time and
    its tokens/s and MFU, the median and range of its ratio to the plain compiled loop of the same round, and the
    rest (ops, memory, syncs) of its first round; an error in any round makes the row that error."""
    per_token = llama_flops_per_token(LlamaConfig.named(shape.size, vocab_size=shape.vocab, tie_embeddings=False),
                                      shape.seq)
    peak = peak_bf16(torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    out = []
    for name in names:
        runs = [(rnd[name], rnd.get("plain compiled", {}).get("step_time_s")) for rnd in rounds if name in rnd]
        if not runs:
            continue
        failed = next((r for r, _ in runs if "error" in r), None)
        if failed is not None:
            out.append({"row": name, **failed, "step_time_s": None, "tokens_per_s": None, "mfu": None,
                        "ratio_to_plain_compiled": None, "peak_mem_bytes": None, "aten_ops": None})
            continue
        times = [r["step_time_s"] for r, _ in runs]
        ratio = summarize([r["step_time_s"] / base for r, base in runs if base], "ratio")
        step = statistics.median(times)
        tps = shape.batch * shape.seq / step
        line = {"row": name, **runs[0][0], "step_time_s": step, "step_time_rounds": times, **ratio,
                "tokens_per_s": tps, "mfu": None if name in BOUNDARY_ROWS else mfu(tps, per_token, peak),
                "ratio_to_plain_compiled": ratio["ratio_median"]}
        if name in BOUNDARY_ROWS:
            line["spel_time_s"] = statistics.median(r["spel_time_s"] for r, _ in runs)
        out.append(line)
    return out


def report_markdown(lines: list[dict], meta: dict) -> str:
    cells = [[ln["row"], f"failed: {_cell(ln['error'])}", "–", "–", "–", "–", "–"] if "error" in ln else
             [ln["row"], fmt(ln["step_time_s"], 4), f"{ln['tokens_per_s']:,.0f}",
              fmt(ln["mfu"], 3) if ln["mfu"] is not None else "–", ratio_cell(ln),
              _mib(ln["peak_mem_bytes"]), str(ln["aten_ops"] if ln["aten_ops"] is not None else "–")] for ln in lines]
    s = meta["shape"]
    rounds = s.get("rounds", 1)
    table = markdown_table(["row", "step (s, median)", "tokens/s", "MFU", "step / plain compiled" + (
        ", median [range] over rounds" if rounds > 1 else ""), "peak memory (MiB)", "aten ops / step"], cells)
    return (f"# slimpar bench throughput\n\nMeasured {meta['date']} on {meta['device_name']}, commit "
            f"`{meta['git_commit']}`, torch {meta['versions']['torch']}; LLaMA {s['size']} (untied), batch "
            f"{s['batch']} x {s['seq']}, vocabulary {s['vocab']}, {meta['dtype']}, compile backend "
            f"{meta['backend']}; median of {s['steps']} steps after {s['warmup']} of warm-up"
            f"{_rounds_note(rounds)}. MFU: "
            f"{meta['mfu_note']}. Load (1 min) at start and end: {meta['load_1m'][0]:.1f}, {meta['load_1m'][1]:.1f} "
            f"on {meta['cpus']} CPUs. Peak memory: CUDA's allocator on a GPU; on a CPU the trainer's exact accounting "
            f"(none for the plain loop). Aten ops: one step counted eagerly, compiled rows too (dynamo steps aside "
            f"under the counter's dispatch mode).\n\n{COMPRESSION_NOTE}\n\n{table}\n{_boundary_note(lines)}")


def _rounds_note(rounds: int) -> str:
    if rounds == 1:
        return ""
    return (f", in each of {rounds} rounds (every row once a round, the rows' order rotated by one each round); a "
            "row's step is its median over the rounds, its ratio to the plain compiled loop is taken within a round")


def _boundary_note(lines: list[dict]) -> str:
    """What the boundary row measured: its d, r and tokens, and SPEL's share of its step."""
    ln = next((ln for ln in lines if ln["row"] in BOUNDARY_ROWS and "error" not in ln), None)
    if ln is None:
        return ""
    tokens = ln["tokens_per_s"] * ln["step_time_s"]
    return (f"\nMAPL boundary step: d = {ln['dim']}, r = {ln['rank']}, {tokens:,.0f} tokens; "
            f"{ln['step_time_s'] * 1e3:.2f} ms, of which SPEL's step {ln['spel_time_s'] * 1e3:.2f} ms "
            "(benchmarks/boundary.py).\n")


def _cell(text: str) -> str:
    """An error as one table cell: one line, no pipes, at most 120 characters."""
    return " ".join(text.split()).replace("|", "/")[:120]


def _mib(b) -> str:
    return fmt(b / 2**20, 1) if b is not None else "–"


def parse_rows(text: str) -> list[str] | None:
    """``--rows``: comma-separated row names and groups, where a row's own name may hold a comma ("train compiled,
    loss"): the longest run of pieces that names a row is taken first."""
    parts, names, i = [p.strip() for p in text.split(",")], [], 0
    known = {*PLAIN_ROWS, *BOUNDARY_ROWS, *TRAIN_ROWS}
    while i < len(parts):
        j = next((j for j in range(len(parts), i, -1) if ", ".join(parts[i:j]) in known), i + 1)
        names.append(", ".join(parts[i:j]))
        i = j
    return [n for n in names if n] or None


def row_names(device: str, rows: Iterable[str] | None = None) -> list[str]:
    """The rows to run, in the table's order: ``rows`` (row names or :data:`GROUPS`; a group keeps only the rows
    this device has), else every row this device has."""
    every = [n for n in (*PLAIN_ROWS, *BOUNDARY_ROWS, *TRAIN_ROWS) if device == "cuda" or n not in CUDA_ONLY]
    if rows is None:
        return every
    named = {r for r in rows if r not in GROUPS}
    wanted = named | {n for r in rows if r in GROUPS for n in GROUPS[r] if n in every}
    unknown = sorted(named - set(every))
    if unknown or not wanted:
        raise ConfigError(f"slimpar bench throughput has no row {', '.join(map(repr, unknown))} on {device}; its "
                          f"rows: {', '.join(every)}; groups: {', '.join(GROUPS)}")
    return [n for n in every if n in wanted]


def measure(name: str, shape: Shape, device: str, text: Path, backend: str, out: Path) -> dict:
    """One row's numbers, or ``{"error": ...}``: a row that fails on a new machine (a compile mode, a size that
    does not fit) is recorded and the others still run."""
    try:
        if name in PLAIN_ROWS:
            compiled, mode = PLAIN_ROWS[name]
            return plain_row(shape, torch.device(device), backend if compiled else None, mode)
        if name in BOUNDARY_ROWS:
            return boundary_row(shape.size, shape.vocab, shape.batch, shape.seq, shape.warmup, shape.steps,
                                torch.device(device))
        return train_row(name, shape, device, text, backend, out)
    except Exception as e:  # noqa: BLE001 - recorded in the results and the exit status, never dropped
        return {"error": f"{type(e).__name__}: {e}"[-2000:]}


def bench_throughput(out: Path, size: str = "tiny", device: str = "cpu", quick: bool = False,
                     backend: str = "inductor", rows: Iterable[str] | None = None) -> dict:
    """The rows ``rows`` (default: every row the device has), writing results.json and report.md in ``out`` after
    each."""
    from benchmarks.gpu_check import corpus

    names = row_names(device, rows)
    shape, dev = Shape.of(size, quick), torch.device(device)
    load = [os.getloadavg()[0]]  # a shared CPU's other jobs move CPU timings: the report gives the load
    (out / "runs").mkdir(parents=True, exist_ok=True)
    text = corpus(out / "runs")
    meta = metadata({"shape": shape.__dict__, "device": device, "backend": backend, "quick": quick,
                     "dtype": "bf16 autocast" if device == "cuda" else "fp32",
                     "device_name": torch.cuda.get_device_name(dev) if device == "cuda" else "CPU",
                     "mfu_note": peak_bf16(torch.cuda.get_device_name(dev) if device == "cuda" else None).reason})
    rounds: list[dict[str, dict]] = []
    for k in range(shape.rounds):
        rounds.append({})
        for name in rotated(names, k):
            print(f"[throughput] {name}" + (f" (round {k + 1} of {shape.rounds})" if shape.rounds > 1 else "")
                  + " ...", flush=True)
            rounds[k][name] = measure(name, shape, device, text, backend, out if k == 0 else out / f"round{k + 1}")
            data = {"meta": {**meta, "load_1m": [*load, os.getloadavg()[0]]},
                    "lines": finish(rounds, names, shape, dev)}
            write_json(out / "results.json", data)
            (out / "report.md").write_text(report_markdown(data["lines"], data["meta"]))
    print(json.dumps({ln["row"]: ln["step_time_s"] and round(ln["step_time_s"], 4) for ln in data["lines"]}))
    return data
