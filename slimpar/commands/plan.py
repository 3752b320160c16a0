"""``slimpar plan``: print the SDP plan a config implies (no processes, no memory: a meta-device model), with the
process groups its holder sync would create and join (backward regime: after the refresh roots, timed)."""

from __future__ import annotations

import argparse
import json
import time

from slimpar.config import DEFAULT_CONFIG
from slimpar.sdp.communicators import communicators_report
from slimpar.sdp.holders import refresh_sets
from slimpar.sdp.plan import analytic_bytes_per_step
from slimpar.train.run_plan import run_plan
from slimpar.train.validate.checks import load_run_config
from slimpar.utils import fmt_bytes


def plan_command(args: argparse.Namespace, rest: list[str]) -> int:
    cfg = load_run_config(args.config or str(DEFAULT_CONFIG), ["--parallel.mode", "sdp", *rest], training=False)
    workers = cfg.parallel.workers // cfg.sdp.fsdp
    if cfg.sdp.memory_budget:  # the keeps slimpar train would choose: against the FakeTensorMode prediction
        from slimpar.train.memory.budget import choose_keeps

        plan, _ = choose_keeps(cfg, workers)
    else:
        plan = run_plan(cfg).sdp
    report = plan.report()
    report["analytic_bytes_per_step"] = [analytic_bytes_per_step(plan, r)["total"] for r in range(workers)]
    report["ddp_bytes_per_step"] = analytic_bytes_per_step(plan, 0)["ddp"]
    t0 = time.perf_counter()
    refresh = refresh_sets(plan) if cfg.sdp.regime == "backward" else {}
    roots_s = time.perf_counter() - t0
    report["process_groups"] = communicators_report(plan, cfg.sdp.regime, cfg.sdp.fsdp, refresh=refresh)
    memory = plan.memory  # --sdp.memory_budget (slimpar.sdp.budget)
    if memory is not None:
        report["memory_budget"] = memory.as_dict()
    if args.json:
        print(json.dumps(report))
    else:
        print(plan.table())
        per_worker = ", ".join(f"{b:,}" for b in report["analytic_bytes_per_step"])
        print(f"bytes per step per worker (gradient all-reduces): {per_worker} (DDP: {report['ddp_bytes_per_step']:,})")
        print(_groups_text(report["process_groups"], cfg.sdp.regime, roots_s))
        if memory is not None:
            print("memory budgets (peaks predicted under FakeTensorMode for this run's step: slimpar plan --memory "
                  "--sdp.keep_per_worker with these keeps shows every part)")
            rows = zip(plan.keep_per_worker, memory.budgets, memory.predicted_peak_mem_bytes, strict=True)
            for r, (c, b, peak) in enumerate(rows):
                print(f"  worker {r}: keep {c:.3g}, predicted peak {fmt_bytes(peak)} of budget {fmt_bytes(b)}")
    return 0


def _groups_text(g: dict, regime: str, roots_s: float) -> str:
    """One line: the holder sync's process groups (slimpar.sdp.communicators) and, backward, the roots' time."""
    kinds = "holder sets, refresh sets, all workers" if regime == "backward" else "holder sets, all workers"
    how = f"{g['sets']:,} sets of workers: {kinds}"
    how += " (the world's own group)" if g["world_reused"] else ""
    how += f"; x {g['fsdp']} shards, plus each worker's FSDP2 group" if g["fsdp"] > 1 else ""
    lo, hi = g["per_worker_min"], g["per_worker_max"]
    joins = f"{lo}" if lo == hi else f"{lo}-{hi} (mean {g['per_worker_mean']:.1f})"
    text = f"process groups: {g['created']:,} created on every rank ({how}); a worker joins {joins}"
    return text + (f"; refresh roots computed in {roots_s:.3f} s" if regime == "backward" else "")
