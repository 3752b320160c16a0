"""``slimpar bench throughput``: how much of ``torch.compile``'s gain the trainer keeps, on one device.

Four rows train the same LLaMA shape (untied head) on one device, bf16 autocast and fused AdamW on a GPU (fp32 on
a CPU, which has no bf16 matrix units):

- ``plain eager`` / ``plain compiled``: a reference loop over slimpar's ``Llama`` (forward, cross-entropy, backward,
  AdamW), eager and with every block compiled (``slimpar.parallel.compile.apply_compile``), in this process;
- ``train eager`` / ``train compiled``: ``slimpar train --parallel.mode single`` in a fresh process, without and with
  ``--train.compile true`` (``train compiled, loss`` adds ``--train.compile_scope loss``);
- ``virtual pipeline, none`` / ``MAPL 4x`` / ``MAPL 16x + RVQ``: the same model as a 4-stage virtual pipeline (one
  process, 4 microbatches in one pass), eager: what the stages and each codec cost next to ``train eager``.

Step time is the median over the steps after the warm-up (compilation happens there): on a GPU each plain step
ends with ``torch.cuda.synchronize``, and the trainer synchronizes each step itself (its metrics.jsonl). The
trainer's instrumented step (``log.measure_step``, the third) falls inside the warm-up. ``ratio`` is a row's step
time over the plain compiled loop's. Aten ops per step: a plain step after the warm-up under ``SyncCounter``; a
trainer row's instrumented step (summary.json's ``per_rank[0].aten_ops``). Both run eager, compiled rows included
(dynamo steps aside under a dispatch mode), so they count the eager step's ops, not a compiled step's kernels.
MFU: ``slimpar.parallel.flops``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.report import COMPRESSION_NOTE, fmt, markdown_table, metadata, write_json
from benchmarks.runner import Row, run_row
from slimpar.models.llama import Llama, LlamaConfig
from slimpar.parallel.compile import apply_compile
from slimpar.parallel.flops import llama_flops_per_token, mfu, peak_bf16
from slimpar.parallel.syncs import SyncCounter


@dataclass(frozen=True)
class Shape:
    """The model and batch every row trains, and how many steps each row runs."""

    size: str
    batch: int
    seq: int
    vocab: int
    warmup: int
    steps: int  # measured steps after the warm-up

    @classmethod
    def of(cls, size: str, quick: bool) -> Shape:
        batch, seq, vocab = (16, 1024, 32000) if size not in ("tiny", "mini") else (8, 64, 512)
        return cls(size, batch, seq, vocab, warmup=3, steps=8 if quick else 20)


def plain_row(shape: Shape, device: torch.device, backend: str | None) -> dict:
    """The reference loop; ``backend`` None: eager, else every block compiled with it."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig.named(shape.size, vocab_size=shape.vocab, tie_embeddings=False,
                                    max_seq_len=max(shape.seq, 256))).to(device)
    if backend is not None:
        apply_compile(model.layers, backend)
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    x = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1).float(), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for i in range(shape.warmup + shape.steps):
        if i == shape.warmup and cuda:
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    with SyncCounter() as counter:
        step()
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    return {"step_time_s": statistics.median(times[shape.warmup:]), "aten_ops": counter.count.ops,
            "host_syncs": counter.count.total, "peak_mem_bytes": peak}


TRAINER_ROWS = ("train eager", "train compiled", "train compiled, loss")
PIPELINE_ROWS = ("virtual pipeline, none", "virtual pipeline, MAPL 4x", "virtual pipeline, MAPL 16x + RVQ")
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


def finish(rows: dict[str, dict], shape: Shape, device: torch.device) -> list[dict]:
    """Tokens/s, MFU and the ratio to the plain compiled loop for every row."""
    per_token = llama_flops_per_token(LlamaConfig.named(shape.size, vocab_size=shape.vocab, tie_embeddings=False),
                                      shape.seq)
    peak = peak_bf16(torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    base = rows.get("plain compiled", {}).get("step_time_s")
    out = []
    for name, r in rows.items():
        tps = shape.batch * shape.seq / r["step_time_s"]
        out.append({"row": name, **r, "tokens_per_s": tps, "mfu": mfu(tps, per_token, peak),
                    "ratio_to_plain_compiled": r["step_time_s"] / base if base else None})
    return out


def report_markdown(lines: list[dict], meta: dict) -> str:
    cells = [[ln["row"], fmt(ln["step_time_s"], 4), f"{ln['tokens_per_s']:,.0f}",
              fmt(ln["mfu"], 3) if ln["mfu"] is not None else "–", fmt(ln["ratio_to_plain_compiled"], 2),
              _mib(ln["peak_mem_bytes"]), str(ln["aten_ops"] if ln["aten_ops"] is not None else "–")] for ln in lines]
    table = markdown_table(["row", "step (s, median)", "tokens/s", "MFU", "step / plain compiled",
                            "peak memory (MiB)", "aten ops / step"], cells)
    s = meta["shape"]
    return (f"# slimpar bench throughput\n\nMeasured {meta['date']} on {meta['device_name']}, commit "
            f"`{meta['git_commit']}`, torch {meta['versions']['torch']}; LLaMA {s['size']} (untied), batch "
            f"{s['batch']} x {s['seq']}, vocabulary {s['vocab']}, {meta['dtype']}, compile backend "
            f"{meta['backend']}; median of {s['steps']} steps after {s['warmup']} of warm-up. MFU: "
            f"{meta['mfu_note']}. Load (1 min) at start and end: {meta['load_1m'][0]:.1f}, {meta['load_1m'][1]:.1f} "
            f"on {meta['cpus']} CPUs. Peak memory: CUDA's allocator on a GPU; on a CPU the trainer's exact accounting "
            f"(none for the plain loop). Aten ops: one step counted eagerly, compiled rows too (dynamo steps aside "
            f"under the counter's dispatch mode).\n\n{COMPRESSION_NOTE}\n\n{table}\n")


def _mib(b) -> str:
    return fmt(b / 2**20, 1) if b is not None else "–"


def bench_throughput(out: Path, size: str = "tiny", device: str = "cpu", quick: bool = False,
                     backend: str = "inductor", train_rows: tuple[str, ...] | None = None) -> dict:
    """The plain rows and the trainer rows ``train_rows`` (default: all of ``TRAIN_ROWS``), then results.json and
    report.md in ``out``."""
    from benchmarks.gpu_check import corpus

    shape, dev = Shape.of(size, quick), torch.device(device)
    load = [os.getloadavg()[0]]  # a shared CPU's other jobs move CPU timings: the report gives the load
    out.mkdir(parents=True, exist_ok=True)
    rows = {"plain eager": plain_row(shape, dev, None), "plain compiled": plain_row(shape, dev, backend)}
    (out / "runs").mkdir(exist_ok=True)
    text = corpus(out / "runs")
    for name in TRAIN_ROWS if train_rows is None else train_rows:
        rows[name] = train_row(name, shape, device, text, backend, out)
    lines = finish(rows, shape, dev)
    load.append(os.getloadavg()[0])
    meta = metadata({"shape": shape.__dict__, "device": device, "backend": backend, "quick": quick,
                     "dtype": "bf16 autocast" if device == "cuda" else "fp32",
                     "device_name": torch.cuda.get_device_name(dev) if device == "cuda" else "CPU",
                     "load_1m": load,
                     "mfu_note": peak_bf16(torch.cuda.get_device_name(dev) if device == "cuda" else None).reason})
    data = {"meta": meta, "lines": lines}
    write_json(out / "results.json", data)
    (out / "report.md").write_text(report_markdown(lines, meta))
    print(json.dumps({ln["row"]: round(ln["step_time_s"], 4) for ln in lines}))
    return data
