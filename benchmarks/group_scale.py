"""``python -m benchmarks.group_scale --out DIR``: what building SDP's process groups costs at 8 to 1,024 workers.

For each worker count N and regime, this process joins torch's ``fake`` process group (collectives move
nothing; what ``slimpar plan --memory`` uses) as rank 0 of N and builds what an SDP run builds: the default
config's plan and model (the small LLaMA, 8 blocks, keep 0.5), the backward regime's refresh roots, the holder
sync's process groups (:class:`~slimpar.parallel.groups.GroupFactory`) and the whole
:class:`~slimpar.SubnetworkDataParallel`; with ``sdp.holder_shard`` also FSDP2 over the holder groups, with one
factory for both. Times are the median of ``rounds`` builds on this machine (the fake backend measures the
Python side: the plan, the roots, the all-gather of the wanted sets and ``new_group`` calls, not a network's
connection set-up). Counts: ``new_group`` calls on every rank, and the groups rank 0 joins against the range
over workers that ``slimpar plan`` reports (:func:`slimpar.sdp.communicators.communicators_report`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.report import markdown_table, metadata, write_json

WORKERS = (8, 64, 1024)
ROWS = (("forward", False), ("backward", False), ("forward", True))  # (regime, holder_shard)


def _timed(fn, rounds: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def group_row(n: int, regime: str, holder_shard: bool, rounds: int = 3) -> dict:
    """One row: this process as rank 0 of an n-rank fake group (see the module docstring)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from slimpar.config import DEFAULT_CONFIG
    from slimpar.parallel.groups import GroupFactory
    from slimpar.sdp.apply import apply_subnet
    from slimpar.sdp.comm import GroupComm
    from slimpar.sdp.communicators import communicators_report
    from slimpar.sdp.holder_fsdp import shard_over_holders
    from slimpar.sdp.holders import holder_sets, refresh_sets
    from slimpar.sdp.wrapper import SubnetworkDataParallel
    from slimpar.train.build import build_model
    from slimpar.train.strategies.sdp_plan import plan_from_config
    from slimpar.train.validate.checks import load_run_config

    cfg = load_run_config(str(DEFAULT_CONFIG), ["--parallel.workers", str(n), "--sdp.regime", regime], training=False)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=n)
    try:
        model = build_model(cfg)
        plan_s, plan = _timed(lambda: plan_from_config(cfg, model, n), 1)
        roots_s, refresh = _timed(lambda: refresh_sets(plan) if regime == "backward" else {}, rounds)
        groups_s, comm = _timed(lambda: GroupComm(holder_sets(plan, regime, refresh), n), rounds)

        def wrapper():
            model, factory = build_model(cfg), GroupFactory()
            t0 = time.perf_counter()
            sub = apply_subnet(model, plan, 0, regime=regime)
            if holder_shard:
                shard_over_holders(model, plan, 0, torch.device("cpu"), factory=factory)
            w = SubnetworkDataParallel(model, plan, regime, subnet=sub, fsdp_does_averaging=holder_shard,
                                       groups=factory)
            return time.perf_counter() - t0, factory.new_groups, len(w.holders.comm.groups)  # one factory: all

        built = [wrapper() for _ in range(rounds)]
    finally:
        dist.destroy_process_group()
    report = communicators_report(plan, regime, refresh=refresh)
    return {"workers": n, "regime": regime, "holder_shard": holder_shard, "plan_s": plan_s,
            "refresh_roots_s": roots_s, "group_creation_s": groups_s, "new_group_calls": comm.factory.new_groups,
            "wrapper_s": statistics.median(t for t, _, _ in built), "wrapper_new_group_calls": built[0][1],
            "rank0_joins": built[0][2], "created": report["created"], "per_worker_min": report["per_worker_min"],
            "per_worker_max": report["per_worker_max"], "per_worker_mean": report["per_worker_mean"]}


def bench_groups(out: Path, workers=WORKERS, rows=ROWS, rounds: int = 3) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for regime, shard in rows:  # warm-up, not reported: the first FSDP2 and numpy calls load code
        group_row(workers[0], regime, shard, 1)
    for n in workers:
        for regime, shard in rows:
            results.append(r := group_row(n, regime, shard, rounds))
            print(f"N={n:>5} {regime:<8} holder_shard={shard!s:<5} wrapper {r['wrapper_s']:.3f}s "
                  f"groups {r['new_group_calls']} joined {r['rank0_joins']}", flush=True)
    data = {"metadata": metadata({"rounds": rounds, "backend": "fake", "config": "default (llama small, keep 0.5)"}),
            "rows": results}
    write_json(out / "results.json", data)
    (out / "report.md").write_text(report(results))
    return data


def report(rows: list[dict]) -> str:
    head = ["N", "regime", "holder_shard", "plan s", "refresh roots s", "group creation s", "new_group calls",
            "wrapper build s", "new_group calls in the build", "groups a worker joins (min-max, mean)"]
    body = [[f"{r['workers']:,}", r["regime"], str(r["holder_shard"]), f"{r['plan_s']:.3f}",
             f"{r['refresh_roots_s']:.3f}", f"{r['group_creation_s']:.3f}", str(r["new_group_calls"]),
             f"{r['wrapper_s']:.3f}", str(r["wrapper_new_group_calls"]),
             f"{r['per_worker_min']}-{r['per_worker_max']}, {r['per_worker_mean']:.2f}"] for r in rows]
    return "\n".join([
        "# SDP's process groups at scale (fake backend, rank 0)", "",
        "The default config (the small LLaMA's 8 blocks, keep 0.5) at N workers, built as rank 0 of torch's `fake` "
        "process group: the plan, the backward regime's refresh roots, the holder sync's groups alone, and the "
        "whole `SubnetworkDataParallel` (cutting the subnetwork included; with `holder_shard`, FSDP2 over the "
        "holder groups first, from the same factory: its time is mostly copying each block's shard, 1/k_c of it, "
        "so it is largest at small N). Median of the rounds; `python -m benchmarks.group_scale`.",
        "", markdown_table(head, body), "",
        "Every rank calls `new_group` for every group (the column), and joins only its own (the last column: one "
        "communicator each). The all-worker group is the world's own. With `holder_shard` the holder sync reuses "
        "FSDP2's holder groups: the build creates each once.", ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for results.json and report.md")
    p.add_argument("--rounds", type=int, default=3, help="builds per row (the median is reported)")
    args = p.parse_args(argv)
    bench_groups(Path(args.out), rounds=args.rounds)
    print((Path(args.out) / "report.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
