"""SDP with every block FSDP2-sharded over its holder group equals plain SDP (FSDP2's reduce-scatter
is the holder average), and holds less per rank than the replicated subnetwork."""

import pytest

from tests.helpers import losses, run_train, summary

ARGS = ["--parallel.mode", "sdp", "--parallel.workers", "4", "--sdp.keep", "0.5", "--train.steps", "4",
        "--eval.batches", "1", "--data.ood", "none"]


def test_holder_sharded_fsdp_equals_sdp(tmp_path):
    run_train(tmp_path / "sdp", *ARGS)
    run_train(tmp_path / "sharded", *ARGS, "--sdp.holder_shard", "true")
    assert losses(tmp_path / "sharded") == pytest.approx(losses(tmp_path / "sdp"), rel=1e-5)
    plain, sharded = summary(tmp_path / "sdp"), summary(tmp_path / "sharded")
    assert sharded["val_loss"] == pytest.approx(plain["val_loss"], rel=1e-5)
    # every held block is held by 2 of 4 workers: each holder keeps half of it
    assert sharded["mem_breakdown"]["params"] < 0.6 * plain["mem_breakdown"]["params"]
    ops = sharded["per_rank"][0]["comm_by_op"]
    assert any(k.startswith("_reduce_scatter_base_") and k.endswith("x2") for k in ops)  # holder groups of 2
