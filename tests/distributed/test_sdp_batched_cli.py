"""``slimpar train --sdp.virtual_batched true`` end to end (slow: four CLI runs of the tiny LLaMA).

The batched run (one model copy) against the sequential virtual run (one copy per worker, equal to 4 processes:
test_sdp_virtual.py), block level, forward regime, with ``train.grad_accum 2`` and activation checkpointing: the
logged losses and the exported model agree to fp32 rounding through AdamW (``TOL``), the validation loss too. A
batched run stopped after 1 step resumes as a sequential run, which then equals the uninterrupted sequential run
to the same tolerance.
"""

from __future__ import annotations

import pytest

from slimpar.train.checkpoint.export import load_safetensors
from tests.helpers import losses, run_train, stop_and_resume, summary

pytestmark = pytest.mark.slow

COMMON = ["--parallel.mode", "sdp", "--parallel.workers", "1", "--sdp.virtual", "true", "--sdp.virtual_workers", "4",
          "--train.steps", "3", "--train.grad_accum", "2", "--train.activation_checkpointing", "true",
          "--eval.batches", "1", "--data.ood", "none", "--log.progress", "false", "--fresh"]
BATCHED = ["--sdp.virtual_batched", "true"]
TOL = 1e-4  # fp32: rows of 4 workers share matrix products, AdamW normalises the rounding of small gradients


def _close(a, b) -> None:
    assert max(abs(x - y) for x, y in zip(losses(a), losses(b), strict=True)) < TOL
    assert abs(summary(a)["val_loss"] - summary(b)["val_loss"]) < TOL
    wa, wb = load_safetensors(a / "model.safetensors"), load_safetensors(b / "model.safetensors")
    assert set(wa) == set(wb)
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < TOL


def test_batched_run_equals_sequential_and_resumes_as_it(tmp_path):
    seq, bat, mixed = tmp_path / "seq", tmp_path / "bat", tmp_path / "mixed"
    run_train(seq, *COMMON)
    run_train(bat, *COMMON, *BATCHED)
    _close(seq, bat)
    assert summary(bat)["per_rank"][0]["virtual_batched"] is True
    stop_and_resume(mixed, [*COMMON, *BATCHED], [a for a in COMMON if a != "--fresh"])
    _close(seq, mixed)
