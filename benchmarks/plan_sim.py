"""``slimpar bench plans --out DIR``: SDP plans for up to a thousand workers, on paper.

For N workers x K equal blocks (a synthetic model: no model is built), cyclic and random at keep C,
it times the planner and reports what a plan implies at scale: distinct holder sets (each one a
process group; singletons need none), the groups a worker belongs to, the spectral gap, and the
per-worker parameter bytes and gradient all-reduce bytes per step against DDP.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.report import markdown_table, metadata, write_json
from slimpar.sdp.components import Component
from slimpar.sdp.plan import Plan, plan_components

WORKERS = (8, 32, 128, 512, 1024)
BLOCKS = (8, 32, 128)
ASSIGNMENTS = ("cyclic", "random", "random/16")  # random/G: at most G holder sets (``holder_sets``)
BLOCK_NUMEL = 1 << 20  # 1 Mi fp32 parameters (4 MiB) per block
SHARED_BLOCKS = 2  # embeddings, head and norms: as large as 2 blocks together


def synthetic_components(k: int, numel: int = BLOCK_NUMEL) -> list[Component]:
    """K equal blocks, as ``model_components`` would give for K identical residual blocks."""
    return [Component(f"layers.{i}", param_bytes=4 * numel, flops=2 * numel, params=(f"layers.{i}.w",),
                      layer=f"layers.{i}", numel=numel) for i in range(k)]


def plan_row(n: int, k: int, assignment: str, keep: float = 0.5, seed: int = 0) -> dict:
    comps = synthetic_components(k)
    shared = SHARED_BLOCKS * 4 * BLOCK_NUMEL
    t0 = time.perf_counter()
    kind, _, bound = assignment.partition("/")
    bound = int(bound) if bound else None
    plan = plan_components(comps, shared, n, keep, assignment=kind, seed=seed, holder_sets=bound)
    t1 = time.perf_counter()
    gap, sets, connected = plan.spectral_gap, plan.distinct_holder_sets, plan.connected
    t2 = time.perf_counter()
    groups = [s for s in sets if len(s) > 1]
    per_worker = np.zeros(n, dtype=np.int64)
    for s in groups:
        per_worker[list(s)] += 1
    params, sent = bytes_against_ddp(plan)
    return {"workers": n, "blocks": k, "assignment": assignment, "keep": keep, "seed": seed,
            "plan_s": t1 - t0, "metrics_s": t2 - t1, "holder_sets": len(sets), "groups": len(groups),
            "groups_per_worker_max": int(per_worker.max()), "group_size_mean": float(np.mean([len(s) for s in groups]))
            if groups else 0.0, "connected": connected, "spectral_gap": gap, "masking_error": plan.masking_error,
            "held_per_worker": sorted(set(plan.mask.sum(1).tolist())),
            "param_bytes_vs_ddp": {"max": float(params.max()), "mean": float(params.mean())},
            "allreduce_bytes_vs_ddp": {"max": float(sent.max()), "mean": float(sent.mean())}}


def bytes_against_ddp(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Per worker, as fractions of DDP: resident parameter bytes, and gradient bytes fed into
    all-reduces per step (``analytic_bytes_per_step``'s total, for every rank at once)."""
    b = np.array([c.param_bytes for c in plan.components], dtype=np.int64)
    k_c = plan.mask.sum(0)
    ddp = plan.shared_bytes + int(b.sum())
    params = (plan.shared_bytes + plan.mask.astype(np.int64) @ b) / ddp
    shared_sent = plan.shared_bytes if plan.world_size > 1 else 0
    sent = (shared_sent + plan.mask.astype(np.int64) @ np.where(k_c > 1, b, 0)) / (ddp if plan.world_size > 1 else 1)
    return params, sent


def bench_plans(out: Path, workers=WORKERS, blocks=BLOCKS, assignments=ASSIGNMENTS, keep: float = 0.5) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in workers:
        for k in blocks:
            for a in assignments:
                if "/" in a and int(a.split("/")[1]) >= k:
                    continue  # the bound does not bind: the same plan as plain random
                rows.append(row := plan_row(n, k, a, keep))
                print(f"N={n:>5} K={k:>4} {a:<7} plan {row['plan_s']:.3f}s groups {row['groups']}", flush=True)
    data = {"metadata": metadata({"keep": keep, "block_bytes": 4 * BLOCK_NUMEL,
                                  "shared_bytes": SHARED_BLOCKS * 4 * BLOCK_NUMEL}), "rows": rows}
    write_json(out / "results.json", data)
    (out / "report.md").write_text(report(rows, keep))
    return data


def report(rows: list[dict], keep: float) -> str:
    head = ["N", "blocks", "assignment", "plan s", "metrics s", "holder sets", "groups (>1)", "groups/worker max",
            "connected", "spectral gap", "params vs DDP max / mean", "all-reduce vs DDP max / mean"]
    body = [[str(r["workers"]), str(r["blocks"]), r["assignment"], f"{r['plan_s']:.3f}", f"{r['metrics_s']:.3f}",
             str(r["holder_sets"]), str(r["groups"]), str(r["groups_per_worker_max"]), str(r["connected"]),
             f"{r['spectral_gap']:.4f}",
             f"{r['param_bytes_vs_ddp']['max']:.3f} / {r['param_bytes_vs_ddp']['mean']:.3f}",
             f"{r['allreduce_bytes_vs_ddp']['max']:.3f} / {r['allreduce_bytes_vs_ddp']['mean']:.3f}"] for r in rows]
    total = sum(r["plan_s"] + r["metrics_s"] for r in rows)
    bound = {"cyclic": "min(N, K)", "random": "K (min(K, C(N, CN)) at small N)", "random/16": "16"}
    groups = "; ".join(f"{a}: at most {max(r['groups'] for r in rows if r['assignment'] == a)} groups "
                       f"(bound {bound.get(a, '?')}), lowest spectral gap "
                       f"{min(r['spectral_gap'] for r in rows if r['assignment'] == a):.3f}"
                       for a in dict.fromkeys(r["assignment"] for r in rows))
    return "\n".join([
        "# SDP plans at scale (synthetic equal blocks)", "",
        f"keep C = {keep}; every block {4 * BLOCK_NUMEL:,} bytes (fp32); shared parameters "
        f"{SHARED_BLOCKS * 4 * BLOCK_NUMEL:,} bytes (as large as {SHARED_BLOCKS} blocks). \"plan s\" is "
        "`plan_components`; \"metrics s\" the spectral gap, connectivity and holder sets. A holder set of more "
        "than one worker is one process group; \"groups/worker max\" is how many of them one worker joins. "
        "Bytes are per worker as a fraction of DDP: resident parameters, and gradient bytes fed into "
        "all-reduces per step (shared parameters over all N, each held block over its holders). \"random/16\" is "
        "random assignment with `holder_sets=16`: the blocks are bundled into 16 bundles of equal weight and "
        "each bundle is placed as one component, so at most 16 process groups exist.", "",
        markdown_table(head, body), "", f"Total planner and metrics time: {total:.1f} s.", "",
        f"Process groups do not grow with N: {groups}. A worker joins about C x (groups) of them.", ""])
