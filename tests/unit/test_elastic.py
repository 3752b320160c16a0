"""Elastic runs' pieces in one process: the batch rule, the membership record, the sample log, the data shares."""

import json

import pytest

from slimpar.config import ConfigError
from slimpar.data.shares import batch_share
from slimpar.train.job.elastic import SampleLog, fit_grad_accum, membership_changes, record_start


def test_the_global_batch_stays_and_accumulation_follows_the_world():
    assert fit_grad_accum(16, 1, 2) == 1  # a smaller world takes a larger share: 8 each
    assert fit_grad_accum(16, 2, 4) == 2 and fit_grad_accum(16, 4, 8) == 2  # 2 per worker cannot split in 4
    assert fit_grad_accum(24, 4, 3) == 4 and fit_grad_accum(24, 4, 6) == 4
    with pytest.raises(ConfigError, match="multiple of 60"):
        fit_grad_accum(16, 1, 5)


def test_shares_cover_each_step_once_at_any_world():
    for world in (1, 2, 4, 8):
        got = [p for r in range(world) for p in batch_share(3, r, world, 8)]
        assert got == list(range(24, 32))
    with pytest.raises(ValueError):
        batch_share(0, 0, 3, 8)


def test_a_start_on_another_world_is_a_membership_change(tmp_path):
    assert record_start(tmp_path, 4, 0, 0, "job") is None
    assert record_start(tmp_path, 4, 0, 1, "job") is None  # a restart on the same world
    change = record_start(tmp_path, 2, 6, 2, "job")
    assert change == {"step": 6, "old_world": 4, "new_world": 2, "restart": 2,
                      "reason": "2 worker(s) left: the elastic job re-formed (agent restart count 2), resumed from "
                                "step 6"}
    assert record_start(tmp_path, 4, 8, 0)["reason"] == "2 worker(s) joined: a new start, resumed from step 8"
    assert [c["new_world"] for c in membership_changes(tmp_path)] == [2, 4]
    assert len(json.loads((tmp_path / "membership.json").read_text())["attempts"]) == 4


def test_the_sample_log_keeps_the_trained_step_only():
    log = SampleLog(True)
    log.step = 2
    log.note(2, 1, range(20, 24))
    log.note(2, 0, range(16, 20))
    log.note(2, 0, range(16, 20))  # a second read of the same share (another stage of the replica)
    log.note(0, 0, range(0, 4))  # a read for another step (PCA initialisation): not training
    assert log.collect() == [[16, 20], [20, 24]] and log.collect() == []
    off = SampleLog(False)
    off.step = 0
    off.note(0, 0, range(0, 4))
    assert off.collect() == []


def test_a_memory_budget_is_replanned_for_the_new_share():
    """A re-formed world re-plans with its own share of the global batch: 2 workers take 4 sequences each of
    B = 8 instead of 2, so their activations double and a 9 MiB budget holds 3 of 4 blocks instead of all.
    (The plan a started run's config implies, under the analytic model, which is exact for this fp32 LLaMA:
    ``slimpar train`` and ``slimpar plan`` choose the same keeps against the FakeTensorMode prediction, at
    the cost of predicting, which tests/distributed/test_memory_budget_predicted.py runs.)"""
    from slimpar.train.run_plan import run_plan
    from slimpar.train.strategies.sdp_plan import plan_from_config
    from slimpar.train.validate.checks import load_run_config
    from tests.helpers import TINY

    keeps = {}
    for world in (4, 2):
        cfg = load_run_config(str(TINY), ["--parallel.mode", "sdp", "--parallel.workers", str(world),
                                          "--train.batch_size", "8", "--sdp.memory_budget", "9MiB"], training=False)
        plan = plan_from_config(cfg, run_plan(cfg).meta_model, world)
        keeps[world] = plan.keep_per_worker
        assert plan.memory.tokens_per_worker == 8 // world * 64
    assert keeps == {4: [1.0] * 4, 2: [0.75] * 2}
