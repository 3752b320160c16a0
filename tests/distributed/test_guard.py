"""Guarded training end to end: a diverging run stops non-zero with the step and the fix, exports nothing."""

from __future__ import annotations

from tests.helpers import run_train

ARGS = ["--train.steps", "10", "--train.warmup_steps", "1", "--eval.batches", "1", "--data.ood", "none",
        "--train.lr", "1e6"]


def test_diverging_run_stops_with_the_step_and_the_fix(tmp_path):
    out = tmp_path / "run"
    proc = run_train(out, *ARGS, check=False, timeout=300)
    assert proc.returncode != 0
    assert "slimpar: error: training diverged at step" in proc.stderr and "--train.lr" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (out / "model.safetensors").exists() and not (out / "summary.json").exists()


def test_all_ranks_agree_without_clipping(tmp_path):
    """grad_clip 0: no norm is computed, yet both DDP workers stop at the same step (no hang, no mismatch)."""
    out = tmp_path / "ddp"
    proc = run_train(out, *ARGS, "--train.grad_clip", "0", "--parallel.mode", "ddp", "--parallel.workers", "2",
                     "--train.skip_bad_steps", "2", "--parallel.timeout_s", "60", check=False, timeout=300)
    assert proc.returncode != 0
    assert "after skipping 2 bad step(s)" in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.count("update skipped") == 2, proc.stdout[-3000:]
    assert not (out / "model.safetensors").exists()
