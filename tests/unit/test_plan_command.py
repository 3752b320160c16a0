"""``slimpar plan`` plans without training settings: the batch split over workers is a training rule."""

import json

import pytest

from slimpar.cli import main
from slimpar.config import ConfigError
from slimpar.train.validate import load_run_config


def test_plan_ignores_batch_divisibility(capsys):
    args = ["--parallel.workers", "12", "--sdp.keep", "0.5", "--train.batch_size", "16"]
    with pytest.raises(ConfigError, match="divisible by data-parallel workers"):
        load_run_config("configs/llama_small.toml", ["--parallel.mode", "sdp", *args])
    assert main(["plan", "--config", "configs/llama_small.toml", "--json", *args]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["world_size"] == 12 and report["connected"] and len(report["analytic_bytes_per_step"]) == 12
