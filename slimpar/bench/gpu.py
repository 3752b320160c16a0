"""GPU memory probe: per-worker peak memory of DDP vs SDP subnetworks at paper size, on one device.

One GPU cannot host several NCCL ranks, so this probe measures what one worker holds: for each row it
builds the full model (every DDP worker's share) or worker 0's SDP subnetwork from an 8-worker plan,
trains a few steps *without communication* (gradient averaging does not change memory, and SDP's
buckets are freed each step), and reports ``torch.cuda.max_memory_allocated`` next to slimpar's own
exact accounting of the same step (the dispatch-mode tracker), so the CPU accounting is checked
against CUDA's allocator. On CPU (tests) only the tracker is reported.

Run: ``python -m slimpar.bench.gpu --out docs/results/gpu [--size 134m] [--device cuda]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from slimpar.bench.report import markdown_table, metadata, write_json
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


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="134m")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    results = {name: probe_row(args.size, row, device, args.batch, args.seq) for name, row in ROWS.items()}
    key = "cuda_max_allocated_bytes" if device.type == "cuda" else "tracker_peak_bytes"
    base = results["DDP (full model)"][key]
    rows = [[name, f"{r[key] / 2**30:.3f}", f"{r['tracker_peak_bytes'] / 2**30:.3f}", f"{r[key] / base:.2f}",
             f"{r['step_s']:.3f}"] for name, r in results.items()]
    meta = metadata({"size": args.size, "device": str(device), "batch": args.batch, "seq": args.seq,
                     "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", {"meta": meta, "rows": results})
    table = markdown_table([f"row ({args.size}, worker 0 of 8)", f"{key} (GiB)", "tracker peak (GiB)", "× DDP",
                            "step (s)"], rows)
    (out / "report.md").write_text(f"# GPU memory probe\n\n{meta}\n\n{table}\n")
    print(table)
    return results


if __name__ == "__main__":
    main()
