"""GPU memory probe: per-worker peak memory of DDP vs SDP subnetworks at paper size, on one device.

One GPU cannot host several NCCL ranks, so this probe measures what one worker holds: for each row it
builds the full model (every DDP worker's share) or worker 0's SDP subnetwork from an 8-worker plan,
trains a few steps *without communication* (gradient averaging does not change memory, and SDP's
buckets are freed each step), and reports ``torch.cuda.max_memory_allocated`` next to slimpar's own
exact accounting of the same step (the dispatch-mode tracker), so the CPU accounting is checked
against CUDA's allocator. On CPU (tests) only the tracker is reported.

``--predict`` also puts ``slimpar plan --memory``'s prediction of the same worker's step (FakeTensorMode, the
trainer's own step at ``train.dtype`` bf16 on a GPU) beside each measurement.

Run: ``python -m benchmarks.gpu --out docs/results/gpu [--size 134m] [--device cuda] [--predict]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.report import markdown_table, metadata, write_json
from slimpar.config import CONFIG_DIR
from slimpar.models.llama import Llama, LlamaConfig
from slimpar.parallel.comm import StepInstrument
from slimpar.sdp.apply import apply_subnet
from slimpar.sdp.planner import plan_blocks, plan_neurons
from slimpar.train.memory import accounting as memory

ROWS = {"DDP (full model)": None, "B-SDP 0.69": ("block", 0.69, "forward"), "B-SDP 0.5": ("block", 0.5, "forward"),
        "N-SDP 0.5": ("neuron", 0.5, "forward"), "Bb-SDP 0.5": ("block", 0.5, "backward")}


def probe_row(size: str, row, device: torch.device, batch: int, seq: int, workers: int = 8, steps: int = 3,
              vocab: int = 32000) -> dict:
    torch.manual_seed(0)
    with torch.device(device):  # built where it trains: a 134M init on the host took seconds a row (H200 check)
        model = Llama(LlamaConfig.named(size, vocab_size=vocab, tie_embeddings=False))
    if row is not None:
        level, keep, regime = row
        plan = (plan_blocks if level == "block" else plan_neurons)(model, workers, keep)
        apply_subnet(model, plan, 0, list(plan.shared_params), regime)
    model.to(device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    x = torch.randint(0, vocab, (batch, seq), device=device)
    out = {}
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        static = sum({**memory.param_storages(model), **memory.optimizer_storages(opt)}.values())
        t0 = time.perf_counter()
        with StepInstrument() as inst, torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1).float(), x[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        out = {"tracker_peak_bytes": static + inst.peak, "step_s": time.perf_counter() - t0,
               "params_bytes": sum(memory.param_storages(model).values()),
               "optimizer_bytes": sum(memory.optimizer_storages(opt).values())}
        if device.type == "cuda":
            out["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def predicted_peak(size: str, row, batch: int, seq: int, cuda: bool, workers: int = 8, vocab: int = 32000) -> int:
    """``slimpar plan --memory``'s peak for the probe's worker: a one-process run of the full model for DDP's
    row (a DDP worker without its buckets), else worker 0 of an ``workers``-worker SDP run."""
    from slimpar.train.memory.predict import predict_memory
    from slimpar.train.validate.checks import load_run_config

    overrides = ["--model.size", size, "--model.vocab_size", str(vocab), "--model.tie_embeddings", "false",
                 "--data.seq_len", str(seq), "--train.dtype", "bf16" if cuda else "fp32"]
    if row is None:
        overrides += ["--train.batch_size", str(batch)]
    else:
        level, keep, regime = row
        overrides += ["--parallel.mode", "sdp", "--parallel.workers", str(workers), "--sdp.level", level,
                      "--sdp.keep", str(keep), "--sdp.regime", regime, "--train.batch_size", str(batch * workers)]
    cfg = load_run_config(CONFIG_DIR / "llama_tiny.toml", overrides,
                          training=False, data=False)  # a GPU machine may have no corpus: none is read
    return int(predict_memory(cfg, [0], vocab)[0]["peak_live"])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="134m")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--predict", action="store_true", help="also predict each row with slimpar plan --memory")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = metadata({"size": args.size, "device": str(device), "batch": args.batch, "seq": args.seq,
                     "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None})
    results: dict = {}
    for name, row in ROWS.items():  # results.json after every number: a run cut short keeps what it measured
        results[name] = probe_row(args.size, row, device, args.batch, args.seq)
        write_json(out / "results.json", {"meta": meta, "rows": results})
        print(f"[gpu probe] {name}: measured", flush=True)
    if args.predict:
        for name, row in ROWS.items():
            results[name]["predicted_peak_bytes"] = predicted_peak(args.size, row, args.batch, args.seq,
                                                                   device.type == "cuda")
            write_json(out / "results.json", {"meta": meta, "rows": results})
            print(f"[gpu probe] {name}: predicted", flush=True)
    key = "cuda_max_allocated_bytes" if device.type == "cuda" else "tracker_peak_bytes"
    base = results["DDP (full model)"][key]
    rows = [[name, f"{r[key] / 2**30:.3f}", f"{r['tracker_peak_bytes'] / 2**30:.3f}", f"{r[key] / base:.2f}",
             f"{r['step_s']:.3f}", _gib(r.get("predicted_peak_bytes")),
             f"{r[key] / r['predicted_peak_bytes']:.2f}" if r.get("predicted_peak_bytes") else "–"]
            for name, r in results.items()]
    table = markdown_table([f"row ({args.size}, worker 0 of 8)", f"{key} (GiB)", "tracker peak (GiB)", "× DDP",
                            "step (s)", "plan --memory (GiB)", "measured / predicted"], rows)
    (out / "report.md").write_text(f"# GPU memory probe\n\n{meta}\n\n{table}\n")
    print(table)
    return results


def _gib(b) -> str:
    return f"{b / 2**30:.3f}" if b else "–"


if __name__ == "__main__":
    main()
