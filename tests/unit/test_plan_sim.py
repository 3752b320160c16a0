"""``slimpar bench plans``: the simulation table's numbers agree with the planner's own accounting."""

import json

import numpy as np

from benchmarks.plan_sim import bench_plans, bytes_against_ddp, synthetic_components
from slimpar.sdp.plan import analytic_bytes_per_step, plan_components


def test_bytes_against_ddp_match_analytic_accounting():
    comps = synthetic_components(6, numel=100)
    for n, a in ((1, "cyclic"), (4, "cyclic"), (5, "random"), (12, "random")):
        plan = plan_components(comps, 800, n, 1.0 if n == 1 else 0.5, assignment=a, seed=2)
        params, sent = bytes_against_ddp(plan)
        ddp = 800 + 6 * 400
        np.testing.assert_allclose(params * ddp, plan.bytes_per_worker)
        expected = [analytic_bytes_per_step(plan, r)["total"] for r in range(n)]
        np.testing.assert_allclose(sent * (analytic_bytes_per_step(plan, 0)["ddp"] or 1), expected)


def test_bench_plans_writes_report(tmp_path):
    data = bench_plans(tmp_path, workers=(8, 64), blocks=(8, 32))
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert len(rows) == len(data["rows"]) == 2 * (2 + 3)  # random/16 only where it binds (32 blocks)
    assert all(r["connected"] and r["spectral_gap"] > 0 for r in rows)
    assert all(r["groups"] <= 16 for r in rows if r["assignment"] == "random/16")
    assert "| 64 | 32 | random/16 |" in (tmp_path / "report.md").read_text()
