"""Resume of the SDP x pipeline hybrid and of a tied compressed pipeline (local gloo workers, llama_tiny).

Each case: 3 straight steps against 1 step, a planned stop with its DCP checkpoint (``train.stop_after``),
then ``--resume`` for steps 2 and 3. The losses, the validation loss and every exported weight must be
bit-identical: data order, masks and codebook generators are pure functions of (seed, step), so a
resume that restores all state redoes the same arithmetic in the same order.

- hybrid: 2 stages x 2 replicas, ``pipeline.dp sdp`` at keep 0.5 with MAPL (tiny ties its embedding):
  each replica saves and reloads only the blocks it holds, under their stage names;
- tied: 2 stages, MAPL with 2 RVQ levels (EMA codebooks, the receiver's streamed copy and version,
  a full table every 2 steps) and checksums; both copies of the tied weight and their AdamW states.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import assert_same_run, losses, run_train, stop_and_resume, summary

COMMON = ["--train.steps", "3", "--eval.batches", "1", "--data.ood", "none", "--parallel.mode", "pipeline",
          "--pipeline.stages", "2", "--pipeline.microbatches", "2", "--checkpoint.final", "false",
          "--model.tie_embeddings", "true"]
RUNS = {
    "hybrid": ["--parallel.workers", "4", "--pipeline.dp", "sdp", "--pipeline.sdp_keep", "0.5",
               "--pipeline.codec", "mapl", "--sdp.check_every", "1"],
    "tied_rvq": ["--parallel.workers", "2", "--pipeline.codec", "mapl", "--pipeline.rank", "16",
                 "--pipeline.rvq.levels", "2", "--pipeline.rvq.codebook", "32", "--pipeline.rvq.sync_every", "2",
                 "--pipeline.checksum_every", "2"],
}


@pytest.mark.parametrize("run", list(RUNS))
def test_pipeline_resumes_exactly(run: str, tmp_path: Path) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    run_train(straight, *COMMON, *RUNS[run], timeout=300)
    stop_and_resume(split, [*COMMON, *RUNS[run]], [*COMMON, *RUNS[run]], timeout=300)
    assert len(losses(split)) == 3
    assert_same_run(split, straight)
    if run == "hybrid":
        assert summary(split)["hybrid"]["replica_checks"] == 2  # every resumed step: holders bit-identical
