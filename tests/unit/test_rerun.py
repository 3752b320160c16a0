"""Runs that resume where a user expects: a re-run in runs/<config name> resumes; changed run-defining settings
are exit 2 with the fields named (``--allow-change`` accepts them); the run folder and the command that resumes it
are printed at the start, the end and after Ctrl-C or a failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slimpar.cli import main
from slimpar.config import ConfigError, load_config, to_toml
from slimpar.train.launch.rerun import check_rerun, config_changes
from tests.helpers import ROOT


def _cfg(*overrides: str):
    return load_config("llama_tiny", list(overrides))


def test_changes_are_sorted_into_defining_layout_and_accepted():
    old = _cfg("--model.vocab_size", "512")  # config.toml names the tokenizer's real size
    defining, layout = config_changes(old, _cfg("--train.lr", "1e-3", "--log.every", "5", "--eval.every", "7",
                                                "--train.stop_after", "3", "--checkpoint.every", "2",
                                                "--data.ood", "none"))
    assert defining == ["train.lr: 0.003 -> 0.001"] and layout == []  # logging, eval, checkpoints: accepted
    defining, layout = config_changes(old, _cfg("--parallel.mode", "sdp", "--parallel.workers", "2",
                                                "--train.seed", "1", "--pipeline.codec", "mapl"))
    assert defining == ["train.seed: 0 -> 1"]  # pipeline.* is no section of either run
    assert layout == ["parallel.mode: 'single' -> 'sdp'", "parallel.workers: 1 -> 2"]
    assert config_changes(old, _cfg("--model.size", "mini"))[0] == ["model.size: 'tiny' -> 'mini'"]


def test_a_pipeline_stage_count_change_is_a_layout_change():
    pipe = ("--parallel.mode", "pipeline", "--pipeline.codec", "mapl")
    old = _cfg(*pipe, "--pipeline.stages", "4", "--parallel.workers", "4")
    defining, layout = config_changes(old, _cfg(*pipe, "--pipeline.stages", "2", "--parallel.workers", "2",
                                                "--pipeline.dp", "sdp", "--pipeline.sdp_keep", "0.5"))
    assert defining == []  # noted; checkpoint.check_layout decides what the checkpoint can serve
    assert layout == ["parallel.workers: 4 -> 2", "pipeline.dp: 'ddp' -> 'sdp'", "pipeline.sdp_keep: 1.0 -> 0.5",
                      "pipeline.stages: 4 -> 2"]
    assert config_changes(old, _cfg(*pipe, "--pipeline.stages", "4", "--parallel.workers", "4",
                                    "--pipeline.rank", "8"))[0] == ["pipeline.rank: 0 -> 8"]


def test_extending_a_finished_run_is_a_named_change(tmp_path, capsys):
    (tmp_path / "config.toml").write_text(to_toml(_cfg("--train.steps", "60", "--train.lr", "2e-3")))
    new = _cfg("--train.steps", "80", "--train.lr", "2e-3")
    ckpt = tmp_path / "checkpoints" / "step_000060"
    with pytest.raises(ConfigError) as e:
        check_rerun(tmp_path, new, ckpt, 60, allow=False)
    msg = str(e.value)
    assert "train.steps: 60 -> 80" in msg and "--allow-change" in msg and "--fresh" in msg
    assert "the lr after step 60 becomes 4.90e-04 instead of 2.00e-04" in msg  # the cosine re-stretched
    check_rerun(tmp_path, new, ckpt, 60, allow=True)
    out = capsys.readouterr().out
    assert out.startswith("warning: --allow-change") and "4.90e-04 instead of 2.00e-04" in out
    assert (tmp_path / "config.before_step_000060.toml").read_text() == (tmp_path / "config.toml").read_text()


@pytest.fixture
def fake_launch(tmp_path, monkeypatch):
    import slimpar.train.launch.launcher as launch

    monkeypatch.chdir(tmp_path)
    calls = []

    def run(error=None):
        def fake(cfg, out):
            calls.append(out)
            if error is not None:
                raise error
        monkeypatch.setattr(launch, "launch", fake)
        return calls
    return run


def test_run_folder_and_resume_command_are_printed_at_start_and_end(fake_launch, capsys):
    fake_launch()
    assert main(["train", "--config", "llama_tiny", "--data.ood", "none", "--fresh"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("run folder: runs/llama_tiny  (to resume it: slimpar train --config llama_tiny --data.ood "
                        "none --out runs/llama_tiny)")  # without --fresh
    assert lines[-1] == "run folder: runs/llama_tiny"


@pytest.mark.parametrize("error, code, says", [
    (KeyboardInterrupt(), 130, "slimpar: interrupted; the run folder is runs/llama_tiny; to resume it: slimpar train"),
    (SystemExit(1), 1, "slimpar: training failed; the run folder is runs/llama_tiny"),
])
def test_ctrl_c_or_a_failure_ends_with_one_line_naming_the_folder(fake_launch, capsys, error, code, says):
    fake_launch(error)
    assert main(["train", "--config", "llama_tiny", "--data.ood", "none"]) == code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(says) and err[0].endswith("--out runs/llama_tiny"), err


@pytest.mark.parametrize("env, says", [
    ({}, "slimpar train --config"),
    ({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2"}, "the same torchrun command (... -m slimpar train"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "the same launcher command (... -m slimpar train"),  # srun: no agent
])
def test_the_resume_command_names_the_launcher_that_started_the_ranks(monkeypatch, env, says):
    from slimpar.commands.train import resume_command as _resume_command

    for name in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    line = _resume_command(["train", "--fresh", "--config", "c.toml"], Path("runs/c"), given=False)
    assert line.startswith(says) and "--fresh" not in line, line
    assert line.rstrip(")").endswith("slimpar train --config c.toml --out runs/c"), line


def _train(cwd, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "slimpar", "train", "--config", "llama_tiny", "--data.ood", "none",
                           "--eval.batches", "1", "--train.steps", "4", *args], capture_output=True, text=True,
                          timeout=240, cwd=cwd, env=env)


def test_the_same_command_again_resumes_and_says_so(tmp_path):
    first = _train(tmp_path, "--train.stop_after", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    out = tmp_path / "runs" / "llama_tiny"
    assert "run folder: runs/llama_tiny" in first.stdout and (out / "checkpoints" / "step_000002").is_dir()
    again = _train(tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from step 2, checkpoint runs/llama_tiny/checkpoints/step_000002" in again.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == 2 and summary["resumed_from"].endswith("step_000002")
    assert "slimpar run summary" in again.stdout  # the closing table, although llama_tiny has log.progress false
    changed = _train(tmp_path, "--train.steps", "6", "--train.seed", "3")
    assert changed.returncode == 2 and "Traceback" not in changed.stderr
    assert "train.seed: 0 -> 3" in changed.stderr and "train.steps: 4 -> 6" in changed.stderr
