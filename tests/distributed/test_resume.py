"""Checkpoint/resume: 10 + 10 steps == 20 straight steps (also SDP subnetworks); export and eval."""

import json
import subprocess
import sys

import pytest
import torch

from slimpar.train.checkpoint.export import load_safetensors
from tests.helpers import ROOT, losses, run_train, summary

ARGS = ["--train.steps", "3", "--eval.batches", "2", "--data.ood", "none"]  # the settings of the tiny_run fixture


def test_resume_continues_exactly(tiny_run, tmp_path):
    """2 steps, a planned stop with its checkpoint, then --resume: equal to the 3 straight steps of tiny_run."""
    split = tmp_path / "split"
    run_train(split, *ARGS, "--train.stop_after", "2")
    assert len(losses(split)) == 2 and not (split / "summary.json").exists()
    run_train(split, *ARGS, resume=True)
    assert losses(split) == losses(tiny_run)
    assert summary(split)["val_loss"] == summary(tiny_run)["val_loss"]


def test_export_loads_and_evaluates(tiny_run):
    out = tiny_run
    state = load_safetensors(out / "model.safetensors")
    assert state["output.weight"] is state["tok_embeddings.weight"]  # tied weight stored once
    proc = subprocess.run([sys.executable, "-m", "slimpar", "eval", "--run", str(out)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    evaluated = json.loads((out / "eval.json").read_text())
    assert evaluated["val_loss"] == pytest.approx(summary(out)["val_loss"], rel=1e-6)
    assert all(torch.isfinite(v).all() for v in state.values())


@pytest.mark.slow  # 74 s on 2 cores; SDP's bitwise resume stays in the default suite through
# test_fault_injection.py (a killed SDP worker under torchrun resumes bitwise) and test_sdp_virtual_resume.py
def test_sdp_resume_continues_exactly(tmp_path):
    """Workers hold different subnetworks, so their optimizers have different parameters: each
    rank's state must come back to that rank (optimizer state keyed by parameter name)."""
    args = ["--train.steps", "4", "--eval.batches", "1", "--data.ood", "none", "--checkpoint.export", "false",
            "--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.level", "neuron", "--sdp.keep", "0.5"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    run_train(straight, *args)
    run_train(split, *args, "--train.stop_after", "2")
    run_train(split, *args, resume=True)
    assert losses(split) == losses(straight)
    assert summary(split)["val_loss"] == summary(straight)["val_loss"]
