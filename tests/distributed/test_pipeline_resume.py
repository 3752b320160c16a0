"""A compressed pipeline resumes exactly: 3 + 3 steps from a DCP checkpoint equal 6 straight steps.

Three stages on three gloo workers with everything that carries state across steps: MAPL projectors
(SPEL momentum), factorized anchors, RVQ codebooks (EMA statistics, the receiver's streamed copy and
its version) and the periodic checksum. Each stage's codec halves have their own names, so DCP keeps
both copies of a shared parameter and the optimizer state of each.
"""

from __future__ import annotations

from tests.helpers import losses, run_train, summary

ARGS = ["--train.steps", "6", "--eval.batches", "1", "--data.ood", "none", "--model.tie_embeddings", "false",
        "--checkpoint.export", "false", "--parallel.mode", "pipeline", "--parallel.workers", "3",
        "--pipeline.stages", "3", "--pipeline.schedule", "1f1b", "--pipeline.microbatches", "4",
        "--pipeline.codec", "mapl", "--pipeline.rank", "16", "--pipeline.anchors", "factorized",
        "--pipeline.anchor_dim", "8", "--pipeline.rvq.levels", "2", "--pipeline.rvq.codebook", "64",
        "--pipeline.rvq.sync_every", "2", "--pipeline.checksum_every", "2"]


def test_pipeline_resume_continues_exactly(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    run_train(straight, *ARGS, timeout=300)
    run_train(split, *ARGS, "--train.stop_after", "3", timeout=300)
    assert len(losses(split)) == 3
    run_train(split, *ARGS, resume=True, timeout=300)
    assert losses(split) == losses(straight)
    assert summary(split)["val_loss"] == summary(straight)["val_loss"]
