"""Honest SDP defaults and notes: BatchNorm recalibration on by default for models with BatchNorm, a warning
when validation is far worse than training (naming the fix), and keeps reported as asked, then held (mean and
range over workers), not worker 0's alone."""

import pytest

from slimpar.config import Config
from slimpar.sdp.components import Component
from slimpar.sdp.plan import Plan
from slimpar.train.sinks.metrics import val_gap_warning
from slimpar.train.strategies.base import Strategy
from slimpar.train.strategies.sdp import SDPStrategy
from slimpar.train.strategies.sdp_plan import BN_AUTO_BATCHES, bn_batches, keep_report, keep_text
from tests.helpers import ROOT, run_train, summary


def test_bn_recalibrate_is_auto_by_default_and_explicit_values_stay():
    cfg = Config()
    assert cfg.sdp.bn_recalibrate == -1
    assert bn_batches(cfg, batchnorm=True) == BN_AUTO_BATCHES == 20
    assert bn_batches(cfg, batchnorm=False) == 0
    for n in (0, 5):
        cfg.sdp.bn_recalibrate = n
        assert bn_batches(cfg, batchnorm=True) == bn_batches(cfg, batchnorm=False) == n


def test_val_gap_warning_names_the_fix():
    assert val_gap_warning(1.15, 13.8, "FIX") == ("validation loss 13.8 is 12.0x the training loss 1.15 "
                                                  "(more than 3x): FIX")
    assert val_gap_warning(1.15, 3.0, "FIX") is None  # 2.6x: no warning
    assert val_gap_warning(float("nan"), 13.8, "FIX") is None and val_gap_warning(1.0, None, "FIX") is None


def _sdp_fix(batchnorm: bool, n: int) -> str:
    s = SDPStrategy.__new__(SDPStrategy)  # only the config and the BatchNorm flag matter here
    s.cfg, s.batchnorm = Config(), batchnorm
    s.cfg.sdp.bn_recalibrate = n
    return s.val_gap_fix()


def test_sdp_fix_names_bn_recalibrate_only_where_it_was_off():
    assert "--sdp.bn_recalibrate 20" in _sdp_fix(True, 0)
    generic = Strategy.val_gap_fix(None)
    assert _sdp_fix(True, -1) == _sdp_fix(False, 0) == generic and "bn_recalibrate" not in generic


def _plan(rows: list[list[int]], asked: float | None) -> Plan:
    import numpy as np

    comps = [Component(f"blocks.{i}", 400, 100, (f"blocks.{i}.w",)) for i in range(len(rows[0]))]
    keep = None if asked is None else (asked,) * len(rows)
    return Plan(comps, np.array(rows, dtype=np.uint8), 0, 0, "cyclic", len(rows), keep_asked=keep)


def test_keep_reported_as_asked_then_held_mean_and_range():
    # the ResNet-18 case: 5 maskable blocks, keep 0.5 over 4 workers holds 4, 2, 1 and 4 blocks
    plan = _plan([[1, 1, 1, 1, 0], [0, 1, 0, 1, 0], [0, 0, 1, 0, 0], [1, 0, 1, 1, 1]], 0.5)
    rep = keep_report(plan)
    assert rep["keep_asked"] == [0.5] * 4
    assert rep["keep_held"] == {"mean": pytest.approx(0.55), "min": pytest.approx(0.2), "max": pytest.approx(0.8)}
    assert keep_text(plan) == "keep 0.5 asked, held 0.55 mean (0.2-0.8 over workers)"
    even = _plan([[1, 1, 0, 0], [0, 0, 1, 1]], None)  # an explicit mask: nothing was asked
    assert keep_text(even) == "keep held 0.5 by every worker"


@pytest.fixture(scope="module")
def resnet_run(tmp_path_factory):
    """One virtual SDP run of the tiny ResNet with the defaults (2 steps, closing table printed)."""
    out = tmp_path_factory.mktemp("resnet_sdp") / "run"
    proc = run_train(out, "--parallel.mode", "sdp", "--sdp.virtual", "true", "--sdp.virtual_workers", "4",
                     "--sdp.keep", "0.5", "--train.steps", "2", "--log.progress", "true", "--checkpoint.final",
                     "false", "--checkpoint.export", "false", config=ROOT / "configs" / "resnet_tiny.toml")
    return out, proc.stdout


def test_resnet_sdp_run_recalibrates_by_default_and_reports_keeps(resnet_run):
    out, stdout = resnet_run
    plan = summary(out)["sdp_plan"]
    assert summary(out)["config"]["sdp"]["bn_recalibrate"] == -1 and plan["bn_recalibrate_batches"] == 20
    assert plan["keep_asked"] == [0.5] * 4
    held = plan["keep_per_worker"]
    assert plan["keep_held"] == {"mean": pytest.approx(sum(held) / 4), "min": min(held), "max": max(held)}
    assert min(held) < max(held)  # whole blocks: the workers hold different shares
    assert any("asked" in w and "whole blocks" in w for w in plan["warnings"])
    assert "keep 0.5 asked, held" in " ".join(stdout.split())  # the closing table's plan row
