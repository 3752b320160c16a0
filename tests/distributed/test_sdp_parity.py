"""SDP's special cases and guard rails, through ``slimpar train`` on the tiny LLaMA with 2 gloo workers.

- ``keep = 1.0`` (every worker holds everything) equals torch DDP step for step, in the forward and
  the backward regime: per-step losses (rel 1e-5) and exported parameters (rtol 1e-4, atol 1e-5);
- bytes fed into collectives per rank equal a hand count from the plan and the run's analytic count;
  (a component held by one worker, and bytes of block/neuron plans with holder sets of size 1 and 2,
  are checked on the reference runs of test_sdp_reference.py, which share their runs);
- impossible SDP configurations exit with code 2 before anything is written to the run folder.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slimpar.cli import main as slimpar_main
from slimpar.train.checkpoint.export import load_safetensors
from tests.helpers import ROOT, TINY, losses, run_train, summary
from tests.sdp_reference import config_for, expected_comm_bytes

COMMON = ["--parallel.workers", "2", "--train.steps", "4", "--eval.batches", "1", "--data.ood", "none",
          "--checkpoint.final", "false"]
SDP = ["--parallel.mode", "sdp", "--sdp.check_every", "1"]
RUNS = {  # and "ddp", the session's shared 2-worker DDP run with the same COMMON settings (tests/conftest.py)
    "sdp_forward_keep1": [*SDP, "--sdp.keep", "1.0"],
    "sdp_backward_keep1": [*SDP, "--sdp.keep", "1.0", "--sdp.regime", "backward"],
}
RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ddp2_run) -> dict[str, tuple[Path, list[str]]]:
    """Each run once: its out folder and the overrides it was started with."""
    root = tmp_path_factory.mktemp("sdp_parity")
    assert sorted(ddp2_run[1]) == sorted([*COMMON, "--parallel.mode", "ddp"])  # the same settings as COMMON
    out = {"ddp": ddp2_run}
    for name, extra in RUNS.items():
        overrides = [*COMMON, *extra]
        run_train(root / name, *overrides)
        out[name] = (root / name, overrides)
    return out


def _params(out: Path) -> dict[str, torch.Tensor]:
    return load_safetensors(out / "model.safetensors")


@pytest.mark.parametrize("name", ["sdp_forward_keep1", "sdp_backward_keep1"])
def test_keep_one_losses_equal_ddp(runs, name):
    """keep = 1.0: every step's loss equals DDP's (same data, same full model on every worker)."""
    got, want = losses(runs[name][0]), losses(runs["ddp"][0])
    assert len(got) == len(want) == 4
    assert got == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("name", ["sdp_forward_keep1", "sdp_backward_keep1"])
def test_keep_one_parameters_equal_ddp(runs, name):
    """keep = 1.0: the exported full model equals DDP's export after 4 steps, and both moved away
    from the initial model by far more than the tolerance."""
    got, want = _params(runs[name][0]), _params(runs["ddp"][0])
    assert set(got) == set(want)
    for key, w in want.items():
        torch.testing.assert_close(got[key], w, rtol=RTOL, atol=ATOL, msg=lambda m, k=key: f"{k}: {m}")
    initial = _initial_params(runs[name][1])
    assert max(float((want[k] - p).abs().max()) for k, p in initial.items()) > 100 * ATOL


@pytest.mark.parametrize("name", ["sdp_forward_keep1", "sdp_backward_keep1"])
def test_bytes_equal_hand_count_and_analytic(runs, name):
    """Per rank, bytes entering collectives at the instrumented step equal the hand count from the
    plan (mask + shapes) and the run's analytic count from the plan."""
    out, overrides = runs[name]
    cfg = config_for(TINY, overrides)
    model, plan = _model_and_plan(cfg)
    per_rank = summary(out)["per_rank"]
    assert len(per_rank) == 2
    for rank, r in enumerate(per_rank):
        want = expected_comm_bytes(plan, model, rank, cfg.sdp.regime, cfg.train.grad_clip)
        assert r["comm_bytes"] == want, (rank, r["comm_by_op"])
        assert r["analytic_bytes"] == want


def test_forward_keep_one_sends_what_ddp_sends(runs):
    """keep = 1.0 forward: SDP all-reduces every gradient once, as DDP does, plus the 8-byte
    float64 norm scalar of its clipping."""
    ddp = summary(runs["ddp"][0])["per_rank"]
    sdp = summary(runs["sdp_forward_keep1"][0])["per_rank"]
    numel = sum(p.numel() for p in _model_and_plan(config_for(TINY, runs["sdp_forward_keep1"][1]))[0].parameters())
    assert [r["comm_bytes"] for r in ddp] == [4 * numel] * 2
    assert [r["comm_bytes"] for r in sdp] == [4 * numel + 8] * 2


BAD = {
    "keep_above_one": (["--sdp.keep", "1.5"], "keep"),
    "keep_per_worker_wrong_length": (["--sdp.keep_per_worker", "1.0,0.5,0.5"], "keep"),
    "min_holders_above_workers": (["--sdp.min_holders", "5"], "min_holders"),
    "more_groups_than_units": (["--sdp.level", "neuron", "--sdp.groups", "1000"], "groups"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_sdp_config_is_rejected_before_writing(tmp_path, capsys, case):
    """``slimpar train`` returns 2 with a message naming the problem; the out folder is never made."""
    extra, word = BAD[case]
    out = tmp_path / "run"
    args = ["train", "--config", str(TINY), "--out", str(out), "--parallel.mode", "sdp",
            "--parallel.workers", "4", *extra]
    assert slimpar_main(args) == 2
    err = capsys.readouterr().err
    assert "error" in err and word in err, err
    assert not out.exists()


def test_bad_sdp_config_exit_code_from_the_command_line(tmp_path):
    """The real entry point (``python -m slimpar``) exits with status 2 and writes nothing."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "slimpar", "train", "--config", str(TINY), "--out", str(out),
           "--parallel.mode", "sdp", "--parallel.workers", "4", "--sdp.keep", "1.5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "keep" in proc.stderr
    assert not out.exists()


def _model_and_plan(cfg):
    from slimpar.train.build import build_data, build_model
    from slimpar.train.strategies.sdp_plan import plan_from_config

    model = build_model(cfg, build_data(cfg))
    return model, plan_from_config(cfg, model, cfg.parallel.workers)


def _initial_params(overrides: list[str]) -> dict[str, torch.Tensor]:
    """The initial full model's parameters (built from ``train.seed`` as every rank builds it)."""
    model, _ = _model_and_plan(config_for(TINY, overrides))
    return {n: p.detach().clone() for n, p in model.named_parameters()}
