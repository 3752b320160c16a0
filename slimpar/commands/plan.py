"""``slimpar plan``: print the SDP plan a config implies (no processes, no memory: a meta-device model)."""

from __future__ import annotations

import argparse
import json

from slimpar.config import DEFAULT_CONFIG
from slimpar.sdp.plan import analytic_bytes_per_step
from slimpar.train.strategies.sdp_plan import plan_from_config
from slimpar.train.validate.checks import load_run_config
from slimpar.train.validate.sdp import meta_model
from slimpar.utils import fmt_bytes


def plan_command(args: argparse.Namespace, rest: list[str]) -> int:
    cfg = load_run_config(args.config or str(DEFAULT_CONFIG), ["--parallel.mode", "sdp", *rest], training=False)
    workers = cfg.parallel.workers // cfg.sdp.fsdp
    if cfg.sdp.memory_budget:  # the keeps slimpar train would choose: against the FakeTensorMode prediction
        from slimpar.train.memory.budget import choose_keeps

        plan, _ = choose_keeps(cfg, workers)
    else:
        plan = plan_from_config(cfg, meta_model(cfg), workers)
    report = plan.report()
    report["analytic_bytes_per_step"] = [analytic_bytes_per_step(plan, r)["total"] for r in range(workers)]
    report["ddp_bytes_per_step"] = analytic_bytes_per_step(plan, 0)["ddp"]
    memory = plan.memory  # --sdp.memory_budget (slimpar.sdp.budget)
    if memory is not None:
        report["memory_budget"] = memory.as_dict()
    if args.json:
        print(json.dumps(report))
    else:
        print(plan.table())
        per_worker = ", ".join(f"{b:,}" for b in report["analytic_bytes_per_step"])
        print(f"bytes per step per worker (gradient all-reduces): {per_worker} (DDP: {report['ddp_bytes_per_step']:,})")
        if memory is not None:
            print("memory budgets (peaks predicted under FakeTensorMode for this run's step: slimpar plan --memory "
                  "--sdp.keep_per_worker with these keeps shows every part)")
            rows = zip(plan.keep_per_worker, memory.budgets, memory.predicted_peak_mem_bytes, strict=True)
            for r, (c, b, peak) in enumerate(rows):
                print(f"  worker {r}: keep {c:.3g}, predicted peak {fmt_bytes(peak)} of budget {fmt_bytes(b)}")
    return 0
