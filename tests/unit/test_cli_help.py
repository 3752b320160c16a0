"""The CLI explains itself: ``train --help`` lists every config field; packaged configs are found by name."""

import json
import subprocess
import sys

import pytest

from slimpar.cli import main
from slimpar.config import Config, ConfigError, load_config, resolve_config_path, to_dict


def _leaves(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out += _leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"--{prefix}{k}"]
    return out


def _slimpar(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slimpar", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def test_train_help_lists_every_field_with_default_and_comment(tmp_path):
    proc = _slimpar("train", "--help", cwd=tmp_path)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    for key in _leaves(to_dict(Config())):
        (i,) = [i for i, ln in enumerate(lines) if ln.strip().startswith(key + " ")]
        assert " = " in lines[i], lines[i]  # the default
        assert lines[i + 1].strip(), f"{key} has no comment"
    assert "llama_tiny" in proc.stdout


@pytest.mark.parametrize("args, shown", [
    ([], {"--model.size STR": '"small"', "--parallel.mode STR": '"sdp"', "--parallel.workers INT": "4",
          "--train.lr FLOAT": "0.002"}),  # the packaged default config, which plain `slimpar train` runs
    (["--config", "llama_tiny"], {"--model.size STR": '"tiny"', "--parallel.workers INT": "1",
                                  "--train.lr FLOAT": "0.003", "--log.progress BOOL": "false"}),
])
def test_train_help_shows_the_defaults_that_run(capsys, args, shown):
    with pytest.raises(SystemExit) as exit_:
        main(["train", *args, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for key, value in shown.items():
        assert f"  {key} = {value}\n" in out, key
    assert ("--config llama_tiny" if args else "the default config") in out


def test_print_config_prints_the_resolved_toml_and_exits(capsys, tmp_path, monkeypatch):
    import tomllib

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", "llama_tiny", "--train.steps", "7", "--print-config"]) == 0
    printed = tomllib.loads(capsys.readouterr().out)
    assert printed["train"]["steps"] == 7 and printed["model"]["size"] == "tiny"
    from slimpar.train.validate.device import resolve_device

    want = load_config("llama_tiny", ["--train.steps", "7"])
    resolve_device(want)  # auto becomes this machine's device and backend, as the run's config.toml records them
    assert printed == to_dict(want) and "auto" not in (want.parallel.device, want.parallel.backend)
    assert not (tmp_path / "runs").exists()  # nothing launched, nothing written


@pytest.mark.parametrize("name", ["llama_tiny", "llama_tiny.toml", "configs/llama_tiny.toml"])
def test_packaged_config_by_name_outside_the_repository(tmp_path, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)  # no configs/ folder here
    assert main(["plan", "--config", name, "--parallel.workers", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["connected"] is True


def test_unknown_config_names_the_packaged_ones(tmp_path):
    with pytest.raises(ConfigError, match="llama_small"):
        resolve_config_path("llama_huge")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_version_prints_the_version_not_the_help(capsys):
    from slimpar import __version__, torch_range

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"slimpar {__version__}; {torch_range.describe()}"


def test_top_level_help_is_plain_text_and_names_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out  # the docstring's reST markup is not shown
    (description,) = [ln for ln in out.splitlines() if ln.startswith("slimpar command line:")]
    for command in ("train", "eval", "export", "plan", "bench"):
        assert command in description
