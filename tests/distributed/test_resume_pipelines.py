"""Resume of a tied compressed pipeline (2 local gloo workers, llama_tiny; the hybrid's: test_hybrid.py).

3 straight steps against 1 step, a planned stop with its DCP checkpoint (``train.stop_after``), then
``--resume`` for steps 2 and 3. The losses, the validation loss and every exported weight must be
bit-identical: data order and codebook generators are pure functions of (seed, step), so a resume that
restores all state redoes the same arithmetic in the same order. 2 stages, MAPL with 2 RVQ levels (EMA
codebooks, the receiver's streamed copy and version, a full table every 2 steps) and checksums; both copies
of the tied weight (stage 0's embedding, stage 1's head) and their AdamW states.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import assert_same_run, losses, run_train, stop_and_resume

TIED_RVQ = ["--train.steps", "3", "--eval.batches", "1", "--data.ood", "none", "--parallel.mode", "pipeline",
            "--pipeline.stages", "2", "--pipeline.microbatches", "2", "--checkpoint.final", "false",
            "--model.tie_embeddings", "true", "--parallel.workers", "2", "--pipeline.codec", "mapl",
            "--pipeline.rank", "16", "--pipeline.rvq.levels", "2", "--pipeline.rvq.codebook", "32",
            "--pipeline.rvq.sync_every", "2", "--pipeline.checksum_every", "2"]


@pytest.mark.slow  # the default suite resumes a tied MAPL pipeline in test_hybrid.py; this adds RVQ state (78 s)
def test_tied_rvq_pipeline_resumes_exactly(tmp_path: Path) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    run_train(straight, *TIED_RVQ, timeout=300)
    stop_and_resume(split, TIED_RVQ, TIED_RVQ, timeout=300)
    assert len(losses(split)) == 3
    assert_same_run(split, straight)
