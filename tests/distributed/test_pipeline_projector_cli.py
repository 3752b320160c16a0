"""MAPL's projector options through ``slimpar train`` on local gloo workers, against the virtual pipeline.

One config turns every option on (PCA start over 2 batches, SPEL's own cosine, separate clipping,
zero-started factorized anchors, A frozen after 2 of 3 steps) and runs as 2 stages × 2 data-parallel
replicas (the PCA Gram matrix is summed over the replicas) and as one virtual pipeline. Both ends of
the distributed boundary end bitwise identical and orthonormal, and the two runs agree to rounding.
"""

from __future__ import annotations

import pytest
import torch

from slimpar.train.checkpoint.export import load_safetensors
from tests.helpers import losses, run_train, summary

COMMON = ["--train.steps", "3", "--eval.batches", "1", "--model.tie_embeddings", "false",
          "--parallel.mode", "pipeline", "--checkpoint.final", "false", "--pipeline.stages", "2",
          "--pipeline.schedule", "1f1b", "--pipeline.microbatches", "2", "--pipeline.codec", "mapl",
          "--pipeline.rank", "16", "--pipeline.projector_init", "pca", "--pipeline.pca_batches", "2",
          "--pipeline.spel_schedule", "cosine", "--pipeline.clip_projector", "separate",
          "--pipeline.anchors", "factorized", "--pipeline.anchor_dim", "8", "--pipeline.anchor_init", "zero",
          "--pipeline.anchor_form", "symmetric", "--pipeline.ids", "send",
          "--pipeline.freeze_projector_after", "2", "--pipeline.sync_dtype", "fp32", "--pipeline.spel_lr", "0.05"]
# MAPL's defaults (receiver-only factorized anchors, ids read by every stage, SPEL at a constant step, A clipped on
# its own): only what every run needs
DEFAULTS = [*COMMON[:COMMON.index("--pipeline.projector_init")], "--pipeline.checksum_every", "1"]
RUNS = {"distributed": ["--parallel.workers", "4"],
        "virtual": ["--parallel.workers", "1", "--pipeline.virtual", "true"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("projector")
    for name, extra in RUNS.items():
        run_train(root / name, *COMMON, *extra, timeout=300)
        run_train(root / f"{name}_defaults", *DEFAULTS, *extra, timeout=300)
    return {p.name: p for p in root.iterdir()}


def test_every_projector_option_runs_distributed_like_the_virtual_pipeline(runs) -> None:
    dist_sd = load_safetensors(runs["distributed"] / "model.safetensors")
    virt_sd = load_safetensors(runs["virtual"] / "model.safetensors")
    A = dist_sd["codecs.send0.projector.A"]
    assert torch.equal(A, dist_sd["codecs.recv0.projector.A"])  # both ends bitwise the same
    assert torch.equal(dist_sd["codecs.send0.anchor.E"], dist_sd["codecs.recv0.anchor.E"])
    assert summary(runs["distributed"])["max_orth_error"] < 1e-5
    torch.testing.assert_close(A, virt_sd["codecs.send0.projector.A"], rtol=0, atol=1e-4)
    assert losses(runs["distributed"]) == pytest.approx(losses(runs["virtual"]), rel=1e-4)


def test_mapl_defaults_run_distributed_like_the_virtual_pipeline(runs) -> None:
    """Receiver-only anchors need no exchange and the ids come from each stage's own loader: the 2 x 2
    processes agree with the virtual pipeline, both copies of A stay bitwise equal (checked every step), and
    only the receiver holds an anchor table."""
    dist_sd = load_safetensors(runs["distributed_defaults"] / "model.safetensors")
    virt_sd = load_safetensors(runs["virtual_defaults"] / "model.safetensors")
    assert torch.equal(dist_sd["codecs.send0.projector.A"], dist_sd["codecs.recv0.projector.A"])
    assert "codecs.recv0.anchor.E" in dist_sd and "codecs.send0.anchor.E" not in dist_sd
    assert torch.count_nonzero(dist_sd["codecs.recv0.anchor.E"]) > 0  # it trained from its zero start
    s = summary(runs["distributed_defaults"])
    assert s["shared_param_resyncs"] == 0 and s["max_orth_error"] < 1e-5
    breakdown = s["comm_breakdown"]["b0"]
    # the receiver sends only its int8 part of A's gradient (d x r + a float32 scale per row) and the checksums
    # of steps 1 and 2, averaged over 3 steps: no anchor rows, and no ids forward
    assert breakdown["fwd"]["ids"] == 0
    assert breakdown["bwd"]["sync"] == pytest.approx(64 * 16 + 64 * 4 + 8 * 2 / 3)
    torch.testing.assert_close(dist_sd["codecs.recv0.anchor.E"], virt_sd["codecs.recv0.anchor.E"], rtol=0, atol=1e-4)
    assert losses(runs["distributed_defaults"]) == pytest.approx(losses(runs["virtual_defaults"]), rel=1e-4)
