"""Host syncs per step within their budgets (the instrumented step's count, slimpar/parallel/syncs.py: every point
where a GPU run would wait for the device): an SDP step at most 1 (the guard's one read of the step's numbers), a
MAPL stage at most 2, RVQ's receiver reads one codebook header per step, not one per microbatch.
Before (docs/gpu.md has the counts at 1586a30): per-parameter AdamW step counters, a loss read per micro-batch,
the clip's norm read and applied on the host, every codebook header read and a stop flag read every step."""

import json

import pytest

from tests.helpers import run_train

STEPS = ["--train.steps", "4", "--log.every", "2", "--eval.batches", "1", "--data.ood", "none",
         "--checkpoint.export", "false", "--checkpoint.final", "false", "--train.grad_accum", "2"]
PIPE = ["--parallel.mode", "pipeline", "--parallel.workers", "2", "--pipeline.stages", "2", "--pipeline.codec", "mapl",
        "--pipeline.microbatches", "4", "--train.grad_accum", "1"]
RUNS = {
    "B-SDP": (["--parallel.mode", "sdp", "--parallel.workers", "2"], 1),
    "Bb-SDP": (["--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.regime", "backward"], 1),
    "MAPL 4x, tied, anchors": ([*PIPE, "--pipeline.anchors", "factorized"], 2),
    "MAPL 16x + RVQ": ([*PIPE, "--model.tie_embeddings", "false", "--pipeline.compression", "16",
                        "--pipeline.rvq.levels", "2", "--pipeline.rvq.update_every", "1"], 2),
}


SLOW = {"Bb-SDP", "MAPL 4x, tied, anchors"}  # the same budgets as B-SDP's and RVQ's, by default in -m slow


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in RUNS])
def test_host_syncs_per_step_within_budget(tmp_path, name):
    overrides, budget = RUNS[name]
    run_train(tmp_path / "run", *STEPS, *overrides)
    ranks = json.loads((tmp_path / "run" / "summary.json").read_text())["per_rank"]
    for rank in ranks:
        where = rank["host_syncs_by_kind"]
        assert rank["host_syncs"] <= budget, where
        assert sum(n for site, n in where.items() if "guard" in site) == 1  # the guard's read is counted
        headers = sum(n for site, n in where.items() if "pipeline/boundary.py" in site)
        assert headers <= 1, where  # at most one codebook header read a step (of 4 microbatches)
        assert rank["aten_ops"] > 100  # the counter saw the step
