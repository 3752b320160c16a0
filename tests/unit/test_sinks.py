"""The tracker sinks' shared pieces: which numbers they log, the config as MLflow params, and the exit-2 check
for a tracker whose package is missing."""

import importlib.util

import pytest

from slimpar.config import Config, ConfigError, to_dict
from slimpar.train.sinks.mlflow_sink import flat_params
from slimpar.train.sinks.trackers import check_trackers, record_scalars, summary_scalars


def test_scalars_keep_numbers_only():
    record = {"step": 3, "loss": 2.5, "lr": 1e-3, "instrumented": True, "note": "x"}
    assert record_scalars(record) == {"train/loss": 2.5, "train/lr": 1e-3}
    summary = {"val_loss": 4.0, "steps": 3, "mem_breakdown": {"params": 10, "peak_rss_delta": None}, "mode": "sdp"}
    assert summary_scalars(summary) == {"summary/val_loss": 4.0, "summary/memory_params_bytes": 10}


def test_config_as_params_one_per_leaf_field():
    cfg = Config()
    cfg.sdp.keep_per_worker = [0.5, 0.75]
    params = flat_params(to_dict(cfg))
    assert params["train.lr"] == str(cfg.train.lr) and params["sdp.keep_per_worker"] == "0.5,0.75"
    assert params["log.mlflow"] == "False" and not any(isinstance(v, dict) for v in params.values())


@pytest.mark.parametrize("tracker", ["tensorboard", "mlflow"])
def test_a_tracker_without_its_package_is_refused(monkeypatch, tracker):
    cfg = Config()
    setattr(cfg.log, tracker, True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == tracker else real(name, *a))
    with pytest.raises(ConfigError, match=rf"log.{tracker} = true needs .*slimpar\[{tracker}\]"):
        check_trackers(cfg)
    setattr(cfg.log, tracker, False)
    check_trackers(cfg)
