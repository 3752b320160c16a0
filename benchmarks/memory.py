"""``slimpar bench memory --out DIR``: the paper's per-worker memory table at 134M, 500M and 1B, predicted.

Algorithm: for every (size, mode) row, the run's config (llama_tiny's data section with the size and
workload below) goes to :func:`slimpar.train.memory.predict.predict_memory`, which builds and steps each
asked rank under FakeTensorMode on a fake process group of 8 workers, nothing allocated. DDP and FSDP2
workers are alike (rank 0 stands for all); for SDP one rank per distinct held fraction of the plan is
predicted and the row reports the largest peak. Writes ``results.json`` and ``report.md`` (the paper's
figures beside ours) with the commit and date.
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

from slimpar.config import CONFIG_DIR, Config

SIZES = ("134m", "500m", "1b")
WORKERS, PER_WORKER_BATCH, SEQ, VOCAB = 8, 4, 1024, 32000
WORKLOAD = ["--parallel.workers", str(WORKERS), "--train.batch_size", str(WORKERS * PER_WORKER_BATCH),
            "--data.seq_len", str(SEQ), "--model.vocab_size", str(VOCAB), "--model.max_seq_len", str(SEQ)]
SDP = ["--parallel.mode", "sdp", "--sdp.level", "block"]
AC = ["--train.activation_checkpointing", "true"]
MODES: dict[str, list[str]] = {
    "DDP": ["--parallel.mode", "ddp"],
    "FSDP2 + AC": ["--parallel.mode", "fsdp", *AC],
    "B-SDP C=0.5": [*SDP, "--sdp.keep", "0.5"],
    "B-SDP C=0.69": [*SDP, "--sdp.keep", "0.69"],
    "B-SDP C=0.5 + FSDP2 + AC": [*SDP, "--sdp.keep", "0.5", "--sdp.holder_shard", "true", *AC],
}
# the paper's figures (docs/methods.md, 'SDP claims'; issue 21): (size, mode) -> GB per worker, or a change against DDP
PAPER: dict[tuple[str, str], str] = {
    ("500m", "B-SDP C=0.5"): "-40% vs DDP",
    ("1b", "B-SDP C=0.69"): "-28% vs DDP",
    ("1b", "DDP"): "70.9 GB",
    ("1b", "FSDP2 + AC"): "11.0 GB",
    ("1b", "B-SDP C=0.5 + FSDP2 + AC"): "9.7 GB (B-SDP + FSDP + AC; C not stated)",
}


# the paper's absolute 1B figures, in bytes: the scaling rows say what workload would give them
PAPER_BYTES = {"DDP": 70.9e9, "FSDP2 + AC": 11.0e9, "B-SDP C=0.5 + FSDP2 + AC": 9.7e9}


def row_config(size: str, mode: str, per_worker: int = PER_WORKER_BATCH) -> Config:
    from slimpar.train.validate.checks import load_run_config

    overrides = ["--model.size", size, *WORKLOAD, *MODES[mode], "--train.batch_size", str(WORKERS * per_worker)]
    return load_run_config(CONFIG_DIR / "llama_tiny.toml", overrides, training=False, data=False)  # predicted


def representative_ranks(cfg: Config) -> list[int]:
    """Rank 0 for DDP and FSDP2; for SDP the first rank of each distinct held fraction."""
    if cfg.parallel.mode != "sdp":
        return [0]
    from slimpar.train.run_plan import run_plan

    keeps = run_plan(cfg).sdp.keep_per_worker
    return sorted({k: r for r, k in reversed(list(enumerate(keeps)))}.values())


def predict_row(size: str, mode: str, per_worker: int = PER_WORKER_BATCH) -> dict:
    from slimpar.train.memory.predict import predict_memory

    cfg = row_config(size, mode, per_worker)
    t0 = time.perf_counter()
    ranks = predict_memory(cfg, representative_ranks(cfg))
    top = max(ranks, key=lambda r: r["peak_live"])
    return {"size": size, "mode": mode, "per_rank": ranks, "worst": top, "seconds": time.perf_counter() - t0}


def bench_memory(out: Path, sizes: tuple[str, ...] = SIZES, modes: tuple[str, ...] = tuple(MODES)) -> dict:
    from slimpar.train.sinks.metrics import git_commit, versions

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in sizes:
        for mode in modes:
            rows.append(predict_row(size, mode))
            print(f"{size} {mode}: {rows[-1]['worst']['peak_live'] / 1e9:.2f} GB ({rows[-1]['seconds']:.0f} s)",
                  flush=True)
    scaling = [scaling_row(mode, next(r for r in rows if r["size"] == "1b" and r["mode"] == mode))
               for mode in PAPER_BYTES if "1b" in sizes and mode in modes]
    data = {"commit": git_commit(), "date": datetime.date.today().isoformat(), "versions": versions(),
            "workload": {"workers": WORKERS, "per_worker_batch": PER_WORKER_BATCH, "seq_len": SEQ, "vocab": VOCAB,
                         "dtype": "fp32 parameters, gradients, AdamW states and activations (no autocast)",
                         "overrides": WORKLOAD},
            "rows": rows, "scaling_1b": scaling}
    (out / "results.json").write_text(json.dumps(data, indent=2))
    (out / "report.md").write_text(report(data))
    return data


def scaling_row(mode: str, row: dict) -> dict:
    """The 1B row again at twice the tokens per worker: bytes of peak per token (everything that grows
    with the batch: activations, logits and their gradient), and the tokens per worker at which this
    slope reaches the paper's figure."""
    twice = predict_row("1b", mode, 2 * PER_WORKER_BATCH)
    tokens = PER_WORKER_BATCH * SEQ
    base, more = row["worst"]["peak_live"], twice["worst"]["peak_live"]
    per_token = (more - base) / tokens
    fixed = base - per_token * tokens
    return {"mode": mode, "tokens": tokens, "peak": base, "peak_at_2x": more, "bytes_per_token": per_token,
            "fixed_bytes": fixed, "paper_bytes": PAPER_BYTES[mode],
            "tokens_for_paper": (PAPER_BYTES[mode] - fixed) / per_token}


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def report(data: dict) -> str:
    """The Markdown table: parts of the worst worker in GB (10^9 bytes), its change against DDP, the paper."""
    w = data["workload"]
    lines = [f"Predicted per-worker memory (slimpar plan --memory), commit `{data['commit']}`, {data['date']}.",
             f"Workload: {w['workers']} workers, {w['per_worker_batch']} sequences x {w['seq_len']} tokens per worker "
             f"and step, vocabulary {w['vocab']}, {w['dtype']}. GB = 10^9 bytes; the worker with the largest peak.",
             "", "| size | mode | params | grads | optimizer | activations | peak | vs DDP | paper |",
             "|---|---|---|---|---|---|---|---|---|"]
    ddp = {r["size"]: r["worst"]["peak_live"] for r in data["rows"] if r["mode"] == "DDP"}
    for r in data["rows"]:
        m, base = r["worst"], ddp.get(r["size"])
        change = f"{(m['peak_live'] / base - 1) * 100:+.0f}%" if base else "-"
        paper = PAPER.get((r["size"], r["mode"]), "")
        lines.append(f"| {r['size']} | {r['mode']} | {_gb(m['params'])} | {_gb(m['grads'])} | {_gb(m['optimizer'])} | "
                     f"{_gb(m['activations'])} | {_gb(m['peak_live'])} | {change} | {paper} |")
    if data.get("scaling_1b"):
        lines += ["", "1B at twice the tokens per worker: peak = fixed + bytes per token x tokens per worker.", "",
                  "| mode | fixed (GB) | MB per token | peak at 2x tokens (GB) | paper (GB) | "
                  "tokens per worker for the paper's figure |", "|---|---|---|---|---|---|"]
        for s in data["scaling_1b"]:
            lines.append(f"| {s['mode']} | {_gb(s['fixed_bytes'])} | {s['bytes_per_token'] / 1e6:.2f} | "
                         f"{_gb(s['peak_at_2x'])} | "
                         f"{_gb(s['paper_bytes'])} | {s['tokens_for_paper']:,.0f} |")
    return "\n".join(lines) + "\n"
