"""``slimpar plan`` plans without training settings: the batch split over workers is a training rule."""

import json

import pytest

from slimpar.cli import main
from slimpar.config import ConfigError
from slimpar.train.validate.checks import load_run_config


def test_plan_ignores_batch_divisibility(capsys):
    args = ["--parallel.workers", "12", "--sdp.keep", "0.5", "--train.batch_size", "16"]
    with pytest.raises(ConfigError, match="divisible by data-parallel workers"):
        load_run_config("configs/llama_small.toml", ["--parallel.mode", "sdp", *args])
    assert main(["plan", "--config", "configs/llama_small.toml", "--json", *args]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["world_size"] == 12 and report["connected"] and len(report["analytic_bytes_per_step"]) == 12


@pytest.mark.parametrize("level, unit", [("block", "6 of 8 whole blocks"), ("neuron", "24 of 32 whole unit groups")])
def test_a_keep_rounded_to_whole_components_is_a_warning(capsys, level, unit):
    assert main(["plan", "--sdp.keep", "0.69", "--sdp.level", level, "--json"]) == 0  # llama_small: 8 blocks
    report = json.loads(capsys.readouterr().out)
    assert report["keep_per_worker"] == [0.75] * 4 and report["keep_asked"] == [0.69] * 4
    assert report["warnings"] == [f"keep 0.69 asked, workers 0-3 hold 0.75 ({unit})"]


def test_per_worker_rounding_names_each_worker_and_exact_keeps_warn_nothing(capsys):
    assert main(["plan", "--sdp.keep_per_worker", "0.3,0.5,0.7,0.9", "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert warnings == ["keep 0.3 asked, worker 0 holds 0.25 (2 of 8 whole blocks)",
                        "keep 0.7 asked, worker 2 holds 0.625 (5 of 8 whole blocks)",
                        "keep 0.9 asked, worker 3 holds 0.875 (7 of 8 whole blocks)"]
    assert main(["plan", "--sdp.keep", "0.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []
