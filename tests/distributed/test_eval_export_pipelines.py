"""Every run kind evaluates and exports: ``slimpar eval --run`` (without and ``--through-codecs`` through the
boundary codecs) and ``slimpar export --hf`` on pipeline, hybrid and virtual runs (llama_tiny, 2 steps)."""

import json
import subprocess
import sys

import pytest
import torch

from slimpar.commands.evaluate import evaluate_run
from slimpar.commands.export_hf import export_hf
from slimpar.train.checkpoint.export import load_safetensors
from tests.helpers import ROOT, LazyRuns, run_train, summary

COMMON = ["--train.steps", "2", "--eval.batches", "1", "--data.ood", "none", "--checkpoint.final", "false"]
PIPE = ["--parallel.mode", "pipeline", "--pipeline.stages", "2", "--pipeline.microbatches", "2"]
RUNS = {
    "pipeline_mapl": [*PIPE, "--parallel.workers", "2", "--pipeline.codec", "mapl"],
    "hybrid_mapl": [*PIPE, "--parallel.workers", "4", "--pipeline.dp", "sdp", "--pipeline.sdp_keep", "0.5",
                    "--pipeline.codec", "mapl"],
    "virtual_mapl_rvq_anchors": [*PIPE, "--pipeline.virtual", "true", "--pipeline.codec", "mapl",
                                 "--pipeline.rvq.levels", "2", "--pipeline.rvq.codebook", "16",
                                 "--pipeline.anchors", "factorized"],
    "virtual_ssn": [*PIPE, "--pipeline.virtual", "true", "--pipeline.codec", "ssn", "--model.tie_embeddings", "false"],
    "virtual_int8": [*PIPE, "--pipeline.virtual", "true", "--pipeline.codec", "int8"],
    "virtual_sdp": ["--parallel.mode", "sdp", "--sdp.virtual", "true", "--sdp.virtual_workers", "2"],
}
PIPELINES = [k for k in RUNS if k != "virtual_sdp"]
# left to -m slow for the default suite's 15-minute budget: two more one-process codecs, and the hybrid (4
# processes; its model and codec state are the pipeline's, which pipeline_mapl covers) except through its codecs:
# with 2 replicas its r (compression_of total: a replica's rows per microbatch) is not one process's
SLOW = {"virtual_ssn", "virtual_int8", "hybrid_mapl"}


def _cases(names: list[str], slow: set[str] = SLOW) -> list:
    return [pytest.param(n, marks=pytest.mark.slow) if n in slow else n for n in names]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    def make(name):
        out = tmp_path_factory.mktemp(name) / "run"
        run_train(out, *COMMON, *RUNS[name])
        return out

    return LazyRuns(make)


@pytest.mark.parametrize("name", _cases(list(RUNS)))
def test_eval_run_without_codecs(runs, name):
    results = evaluate_run(runs[name])
    assert json.loads((runs[name] / "eval.json").read_text()) == pytest.approx(results)
    assert results["val_loss"] == pytest.approx(summary(runs[name])["val_loss"], rel=0.05)  # close, not equal
    if name == "virtual_sdp":  # no codecs: the model the run evaluated, the same number
        assert results["val_loss"] == pytest.approx(summary(runs[name])["val_loss"], rel=1e-5)


@pytest.mark.parametrize("name", _cases(PIPELINES, SLOW - {"hybrid_mapl"}))
def test_eval_run_through_codecs_is_the_runs_own_validation(runs, name):
    results = evaluate_run(runs[name], through_codecs=True)
    assert results["val_loss"] == pytest.approx(summary(runs[name])["val_loss"], rel=1e-5, abs=1e-5)
    assert (runs[name] / "eval_through_codecs.json").is_file()


def test_eval_cli_flag_and_refusal(runs):
    cmd = [sys.executable, "-m", "slimpar", "eval", "--run", str(runs["pipeline_mapl"]), "--through-codecs"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and "val_loss" in proc.stdout, proc.stderr
    cmd = [sys.executable, "-m", "slimpar", "eval", "--run", str(runs["virtual_sdp"]), "--through-codecs"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "not a pipeline run" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", _cases(list(RUNS)))
def test_export_hf_puts_codecs_beside_the_model(runs, name, tmp_path):
    written = {p.name for p in export_hf(runs[name], tmp_path / "hf")}
    run_state = load_safetensors(runs[name] / "model.safetensors")
    codecs = {k[len("codecs."):]: v for k, v in run_state.items() if k.startswith("codecs.")}
    hf = load_safetensors(tmp_path / "hf" / "model.safetensors")
    assert hf and not any("codecs" in k for k in hf)
    if name in ("virtual_sdp", "virtual_int8"):  # no codec state (int8 has no parameters)
        assert not codecs and "codecs.safetensors" not in written
        return
    assert codecs and "codecs.safetensors" in written
    assert "codecs.safetensors" in json.loads((tmp_path / "hf" / "manifest.json").read_text())["files"]
    saved = load_safetensors(tmp_path / "hf" / "codecs.safetensors")
    assert set(saved) == set(codecs)
    for k, v in codecs.items():
        assert torch.equal(saved[k], v), k
