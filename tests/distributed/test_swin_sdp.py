"""Block-level SDP on the Swin model (digits, narrow): runs, keeps replicas identical, bytes = plan."""

from tests.helpers import ROOT, run_train, summary

RESNET_TINY = ROOT / "configs" / "resnet_tiny.toml"


def test_swin_block_sdp(tmp_path):
    out = tmp_path / "swin"
    run_train(out, "--model.arch", "swin", "--model.embed_dim", "12", "--parallel.mode", "sdp",
              "--parallel.workers", "2", "--sdp.keep", "0.5", "--train.steps", "3", "--sdp.check_every", "1",
              "--eval.batches", "1", config=RESNET_TINY)
    s = summary(out)
    assert 0 <= s["val_accuracy"] <= 1 and s["train_loss"] == s["train_loss"]  # finite
    plan = s["sdp_plan"]
    assert plan["connected"] and len(plan["holders_per_component"]) == 10  # Swin blocks (2, 2, 4, 2)
    for rank in s["per_rank"]:
        assert rank["comm_bytes"] == rank["analytic_bytes"]
    ddp_bytes = s["per_rank"][0]["analytic_ddp_bytes"]
    assert s["comm_bytes_per_step"] < ddp_bytes
