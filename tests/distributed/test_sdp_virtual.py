"""SDP simulated in one process (``--sdp.virtual true``) equals the 4-process gloo run.

For {block, neuron} x {forward, backward} on the tiny LLaMA, 3 steps: the logged losses (the real
run's is the mean over its 4 workers' losses, the virtual run's the mean over its 4 simulated
workers), the exported full model (max abs difference <= 1e-6) and the validation loss. Each real
4-worker run and each virtual run is made once (module fixture).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slimpar.train.checkpoint.export import load_safetensors
from tests.helpers import LazyRuns, losses, run_train, summary

COMMON = ["--parallel.mode", "sdp", "--train.steps", "3", "--eval.batches", "1", "--data.ood", "none",
          "--checkpoint.final", "false", "--log.progress", "false", "--sdp.check_every", "1", "--fresh"]
CASES = [("block", "forward"), ("block", "backward"), ("neuron", "forward"), ("neuron", "backward")]
TOL = 1e-6


def _pair(root: Path, level: str, regime: str) -> tuple[Path, Path]:
    args = [*COMMON, "--sdp.level", level, "--sdp.regime", regime]
    real, virtual = root / f"real_{level}_{regime}", root / f"virtual_{level}_{regime}"
    run_train(real, *args, "--parallel.workers", "4")
    run_train(virtual, *args, "--parallel.workers", "1", "--sdp.virtual", "true", "--sdp.virtual_workers", "4")
    return real, virtual


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, str], tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("sdp_virtual")
    return LazyRuns(lambda case: _pair(root, *case))


# the default suite keeps the most involved pairing (neuron slices, backward refresh); the others: -m slow
SLOW = {("block", "forward"), ("block", "backward"), ("neuron", "forward")}
PARAMS = [pytest.param(c, id=f"{c[0]}-{c[1]}", marks=[pytest.mark.slow] if c in SLOW else []) for c in CASES]


def parity(real: Path, virtual: Path) -> dict[str, float]:
    """Max abs parameter difference, max relative loss difference, val_loss difference."""
    a, b = load_safetensors(real / "model.safetensors"), load_safetensors(virtual / "model.safetensors")
    assert set(a) == set(b)
    dparam = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    la, lb = losses(real), losses(virtual)
    assert len(la) == len(lb) == 3
    dloss = max(abs(x - y) / abs(x) for x, y in zip(la, lb, strict=True))
    dval = abs(summary(real)["val_loss"] - summary(virtual)["val_loss"])
    return {"max_abs_param": dparam, "max_rel_loss": dloss, "abs_val_loss": dval}


@pytest.mark.parametrize("case", PARAMS)
def test_virtual_equals_four_processes(runs, case):
    real, virtual = runs[case]
    got = parity(real, virtual)
    print(f"\nvirtual SDP parity {case}: {json.dumps(got)}")
    assert got["max_abs_param"] <= TOL
    assert got["max_rel_loss"] <= TOL
    assert got["abs_val_loss"] <= TOL
    # the model moved by far more than the tolerance: the comparison is not vacuous
    first = load_safetensors(real / "model.safetensors")
    assert max(float(t.float().abs().max()) for t in first.values()) > 1000 * TOL
    s = summary(virtual)
    assert s["world_size"] == 1 and s["per_rank"][0]["virtual_workers"] == 4
    assert s["per_rank"][0]["analytic_bytes"] == pytest.approx(
        sum(r["analytic_bytes"] for r in summary(real)["per_rank"]) / 4)


def test_virtual_config_errors(tmp_path, capsys):
    """Impossible virtual settings exit with code 2 and a clear message (checked in the launching process)."""
    from slimpar.cli import main
    from tests.helpers import TINY

    base = ["train", "--config", str(TINY), "--out", str(tmp_path / "bad"), "--parallel.mode", "sdp",
            "--sdp.virtual", "true", "--train.steps", "1"]
    for extra, words in ((["--parallel.workers", "4"], "parallel.workers 1"),
                         (["--parallel.workers", "1", "--sdp.holder_shard", "true"], "holder_shard"),
                         (["--parallel.workers", "1", "--sdp.fsdp", "2"], "sdp.fsdp"),
                         (["--parallel.workers", "1", "--sdp.virtual_workers", "3"], "virtual_workers")):
        assert main([*base, *extra]) == 2, extra
        assert words in capsys.readouterr().err, extra
    assert not (tmp_path / "bad").exists()
