"""MAPL's projector options through ``slimpar train`` on local gloo workers, against the virtual pipeline.

One config turns every option on (PCA start over 2 batches, SPEL's own cosine, separate clipping,
zero-started factorized anchors, A frozen after 2 of 3 steps) and runs as 2 stages × 2 data-parallel
replicas (the PCA Gram matrix is summed over the replicas) and as one virtual pipeline. Both ends of
the distributed boundary end bitwise identical and orthonormal, and the two runs agree to rounding.
"""

from __future__ import annotations

import pytest
import torch

from slimpar.train.checkpoint import load_safetensors
from tests.helpers import losses, run_train, summary

COMMON = ["--train.steps", "3", "--eval.batches", "1", "--model.tie_embeddings", "false",
          "--parallel.mode", "pipeline", "--checkpoint.final", "false", "--pipeline.stages", "2",
          "--pipeline.schedule", "1f1b", "--pipeline.microbatches", "2", "--pipeline.codec", "mapl",
          "--pipeline.rank", "16", "--pipeline.projector_init", "pca", "--pipeline.pca_batches", "2",
          "--pipeline.spel_schedule", "cosine", "--pipeline.clip_projector", "separate",
          "--pipeline.anchors", "factorized", "--pipeline.anchor_dim", "8", "--pipeline.anchor_init", "zero",
          "--pipeline.freeze_projector_after", "2", "--pipeline.sync_dtype", "fp32", "--pipeline.spel_lr", "0.05"]
RUNS = {"distributed": ["--parallel.workers", "4"],
        "virtual": ["--parallel.workers", "1", "--pipeline.virtual", "true"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("projector")
    for name, extra in RUNS.items():
        run_train(root / name, *COMMON, *extra, timeout=300)
    return {name: root / name for name in RUNS}


def test_every_projector_option_runs_distributed_like_the_virtual_pipeline(runs) -> None:
    dist_sd = load_safetensors(runs["distributed"] / "model.safetensors")
    virt_sd = load_safetensors(runs["virtual"] / "model.safetensors")
    A = dist_sd["codecs.send0.projector.A"]
    assert torch.equal(A, dist_sd["codecs.recv0.projector.A"])  # both ends bitwise the same
    assert torch.equal(dist_sd["codecs.send0.anchor.E"], dist_sd["codecs.recv0.anchor.E"])
    assert summary(runs["distributed"])["max_orth_error"] < 1e-5
    torch.testing.assert_close(A, virt_sd["codecs.send0.projector.A"], rtol=0, atol=1e-4)
    assert losses(runs["distributed"]) == pytest.approx(losses(runs["virtual"]), rel=1e-4)
