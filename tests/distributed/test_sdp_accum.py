"""SDP gradient accumulation (``no_sync`` on all but the last micro-batch) equals one large batch."""

import pytest

from tests.helpers import losses, run_train

ARGS = ["--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.keep", "0.5", "--train.steps", "4",
        "--eval.batches", "1", "--data.ood", "none", "--sdp.check_every", "1"]


def test_accumulation_matches_full_batch(tmp_path):
    run_train(tmp_path / "one", *ARGS)
    run_train(tmp_path / "accum", *ARGS, "--train.grad_accum", "2")
    assert losses(tmp_path / "accum") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)
