"""SDP × MAPL hybrid through ``slimpar train`` (``--pipeline.dp sdp``; local gloo workers, llama_tiny, 3 steps).

- keep 1 with codec ``none``, 2 stages × 2 replicas: the same losses and exported weights as pipeline × DDP;
- one replica (2 stages × 1): the same as the plain pipeline (keep is forced to 1, SDP with one worker is a no-op);
- keep 0.5 with codec ``mapl``, 2 stages × 2 and × 4 replicas: finite losses, holders bit-identical after every step
  (``sdp.check_every 1`` raises otherwise), A orthonormal, and the holder-group bytes equal the hand count
  from the plan, reported apart from the boundary bytes;
- keep 0.5 with ``mapl`` stopped after step 1 and resumed: bit-identical to the straight run (losses, validation
  loss, exported weights): each replica saves and reloads the blocks it holds, under their stage names.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from slimpar.train.checkpoint.export import load_safetensors
from tests.helpers import LazyRuns, assert_same_run, losses, run_train, stop_and_resume, summary

COMMON = ["--train.steps", "3", "--eval.batches", "1", "--data.ood", "none", "--parallel.mode", "pipeline",
          "--pipeline.stages", "2", "--pipeline.microbatches", "2", "--checkpoint.final", "false"]
HYBRID = ["--pipeline.dp", "sdp"]
RUNS = {
    "ddp": ["--parallel.workers", "4"],
    "keep1": ["--parallel.workers", "4", *HYBRID, "--pipeline.sdp_keep", "1"],
    "pipe": ["--parallel.workers", "2"],
    "one_replica": ["--parallel.workers", "2", *HYBRID, "--pipeline.sdp_keep", "0.5"],
    "mapl": ["--parallel.workers", "4", *HYBRID, "--pipeline.sdp_keep", "0.5", "--pipeline.codec", "mapl",
             "--sdp.check_every", "1"],  # exported: the resume test compares its weights
    # 4 replicas: holder sets {0,1}, {1,2}, {2,3}, {0,3} are proper sub-groups of each stage's replica group
    "mapl8": ["--parallel.workers", "8", *HYBRID, "--pipeline.sdp_keep", "0.5", "--pipeline.codec", "mapl",
              "--sdp.check_every", "1", "--checkpoint.export", "false"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")

    def make(name: str) -> Path:
        run_train(root / name, *COMMON, *RUNS[name], timeout=300)
        return root / name

    return LazyRuns(make)


# one replica (SDP over a single worker is a no-op) in -m slow: keep 1 against pipeline x DDP runs by default
@pytest.mark.parametrize(("run", "ref"), [("keep1", "ddp"),
                                          pytest.param("one_replica", "pipe", marks=pytest.mark.slow)])
def test_hybrid_equals_pipeline(runs, run: str, ref: str) -> None:
    assert losses(runs[run]) == pytest.approx(losses(runs[ref]), rel=1e-5)
    assert summary(runs[run])["val_loss"] == pytest.approx(summary(runs[ref])["val_loss"], rel=1e-5)
    got, want = (load_safetensors(runs[r] / "model.safetensors") for r in (run, ref))
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.allclose(got[k], v, atol=1e-5), k
    h = summary(runs[run])["hybrid"]
    assert all(min(k) == h["replicas"] for k in h["holders_per_component"])  # every replica holds every block


@pytest.mark.parametrize("run", ["mapl", pytest.param("mapl8", marks=pytest.mark.slow)])  # 8 processes: slow
def test_keep_half_with_mapl(runs, run: str) -> None:
    from slimpar.models.llama import Llama, LlamaConfig

    s = summary(runs[run])
    assert all(math.isfinite(x) for x in losses(runs[run]))
    assert s["max_orth_error"] <= 1e-5
    h = s["hybrid"]
    assert h["replica_checks"] == 3  # every step: holders (and the replicas' shared parts) bit-identical
    assert any(min(k) < h["replicas"] for k in h["holders_per_component"])  # some block is not everywhere
    block = sum(p.numel() for p in Llama(LlamaConfig.tiny(vocab_size=512)).layers["0"].parameters())
    assert h["block_elements"] == [[block, block], [block, block]]
    for rank, r in enumerate(s["per_rank"]):
        stage, replica = rank % 2, rank // 2
        mask = h["stage_masks"][stage]
        # hand count: each block this replica holds with another holder enters its holder group's all-reduce
        hand = sum(block * 4 for c in range(2) if mask[replica][c] and sum(row[c] for row in mask) > 1)
        assert r["hybrid_holder_bytes"] == hand
        # the DP-side all-reduces (holder groups and the replica group) are exactly holders + the rest
        # (+ the V int32 id mask of the tied embedding's touched rows)
        names = set(r["hybrid_holder_groups"].values())
        dp = sum(n for k, n in r["comm_by_op"].items() if k.startswith("allreduce_@") and k[11:].split("x")[0] in names)
        assert dp == r["hybrid_holder_bytes"] + r["hybrid_dp_bytes"] + r["hybrid_rows_bytes"]
        # the boundary bytes are the pipeline's sends, counted apart
        sends = sum(n for k, n in r["comm_by_op"].items() if k.startswith("send@"))
        assert sends == r["pipeline_bytes_sent"]
        # gradients stay views of their sync buckets: one gradient's worth per parameter, no second copy (the
        # tied embedding's boundary sync once put a new tensor beside the bucket that the others kept alive)
        assert r["mem"]["grads"] == r["mem"]["params"]
    assert s["comm_bytes_per_step_fwd"] > 0 and s["comm_bytes_per_step_bwd"] > 0
    # with keep 0.5 the replicas hold fewer block parameters in all than pipeline × DDP
    held = [sum(r["mem"]["params"] for r in summary(runs[x])["per_rank"]) / len(summary(runs[x])["per_rank"])
            for x in (run, "ddp")]
    assert held[0] < held[1]


@pytest.mark.slow  # a 4-process resume (~30 s under the suite's load); the pipeline's and SDP's resumes run by default
def test_hybrid_resumes_exactly(runs, tmp_path) -> None:
    split = tmp_path / "split"
    stop_and_resume(split, [*COMMON, *RUNS["mapl"]], [*COMMON, *RUNS["mapl"]], timeout=300)
    assert_same_run(split, runs["mapl"])
    assert summary(split)["hybrid"]["replica_checks"] == 2  # every resumed step: holders bit-identical


@pytest.mark.slow  # two 4-process runs (~110 s on 2 cores)
def test_a_pipeline_ddp_checkpoint_resumes_as_the_hybrid(tmp_path) -> None:
    """2 stages × 2 DDP replicas stopped after step 1, resumed with ``--pipeline.dp sdp --pipeline.sdp_keep 0.5``:
    each replica loads the blocks it now holds (the checkpoint names blocks as the full model does), holders stay
    bit-identical (``sdp.check_every 1``) and the codec of the one cut is kept."""
    out, mapl = tmp_path / "run", [*COMMON, "--parallel.workers", "4", "--pipeline.codec", "mapl"]
    stop_and_resume(out, mapl, [*mapl, *HYBRID, "--pipeline.sdp_keep", "0.5", "--sdp.check_every", "1"],
                    timeout=300)
    s = summary(out)
    assert len(losses(out)) == 3 and all(math.isfinite(v) for v in losses(out))
    assert s["hybrid"]["replica_checks"] == 2
    assert s["pipeline_resume"]["boundaries"] == [{"after_block": 1, "codec_state": "kept"}]
