"""Distributed pipelines through ``slimpar train`` (local gloo workers) against a single process.

- ``none``, 2 stages × 2 data-parallel replicas, 1F1B: the same losses and validation loss as
  single-process training, and the bytes each rank counts at its sends equal both torch's c10d
  ``send`` count and the hand count;
- ``mapl`` r = 16 with factorized anchors, sent ids, RVQ and checksums, 3 stages, GPipe: both copies
  of every shared parameter identical and orthonormal at the end, every byte accounted for;
- ``none`` with tied embeddings, 2 stages (the tie's exchange on the boundary's ranks) and 4 stages (a
  direct link between stage 0 and stage 3): the same losses, validation loss and exported (tied)
  weights as the single-process tied model, and the tied exchange's bytes equal the hand count, per rank
  and in the summary's ``tied_bytes_per_step_*``, apart from the boundary bytes.
(``mapl`` with r = d from the identity equals ``none``: tests/unit/test_pipeline_virtual.py, in one
process, since the stages, codecs and messages are the same code.)
"""

from __future__ import annotations

import math

import pytest
import torch

from slimpar.train.checkpoint.export import load_safetensors
from tests.helpers import LazyRuns, losses, run_train, summary

COMMON = ["--train.steps", "3", "--eval.batches", "1", "--model.tie_embeddings", "false"]
PIPE = ["--parallel.mode", "pipeline", "--checkpoint.final", "false"]
B, T, D = 8, 64, 64  # llama_tiny: batch, sequence, width
RUNS = {
    "single": ["--checkpoint.export", "false", "--checkpoint.final", "false"],
    "none": [*PIPE, "--checkpoint.export", "false", "--parallel.workers", "4", "--pipeline.stages", "2",
             "--pipeline.schedule", "1f1b", "--pipeline.microbatches", "2"],
    "single_tied": ["--model.tie_embeddings", "true", "--checkpoint.final", "false"],
    "tied2": [*PIPE, "--model.tie_embeddings", "true", "--parallel.workers", "2", "--pipeline.stages", "2",
              "--pipeline.schedule", "1f1b", "--pipeline.microbatches", "2"],
    "tied4": [*PIPE, "--model.tie_embeddings", "true", "--parallel.workers", "4", "--pipeline.stages", "4",
              "--pipeline.schedule", "gpipe", "--pipeline.microbatches", "2", "--pipeline.checksum_every", "2"],
    "mapl_rvq": [*PIPE, "--parallel.workers", "3", "--pipeline.stages", "3", "--pipeline.schedule", "gpipe",
                 "--pipeline.microbatches", "4", "--pipeline.codec", "mapl", "--pipeline.rank", "16",
                 "--pipeline.anchors", "factorized", "--pipeline.anchor_dim", "8", "--pipeline.anchor_form",
                 "symmetric", "--pipeline.ids", "send", "--pipeline.rvq.levels", "2",  # both copies and the ids
                 "--pipeline.rvq.codebook", "64", "--pipeline.rvq.sync_every", "2", "--pipeline.checksum_every", "2",
                 "--pipeline.spel_lr", "0.05",
                 # the byte checks below were written for rarely re-seeded codes, whose codebook deltas stay
                 # small; the default (1.0) re-seeds every unused code below the mean count (tests/unit/test_rvq.py)
                 "--pipeline.rvq.dead_threshold", "0.01",
                 "--pipeline.projector_init", "random"],  # the start whose bytes the checks below count
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")

    def make(name: str):
        run_train(root / name, *COMMON, *RUNS[name], timeout=300)
        return root / name

    return LazyRuns(make)


def _sends(record: dict) -> int:
    return sum(n for key, n in record["comm_by_op"].items() if key.startswith("send@"))


@pytest.mark.parametrize(("run", "ref"), [("none", "single"), ("tied2", "single_tied"),
                                          pytest.param("tied4", "single_tied", marks=pytest.mark.slow)])
def test_uncompressed_pipeline_equals_single_process(runs, run: str, ref: str) -> None:
    assert losses(runs[run]) == pytest.approx(losses(runs[ref]), rel=1e-5)
    assert summary(runs[run])["val_loss"] == pytest.approx(summary(runs[ref])["val_loss"], rel=1e-5)
    if ref == "single_tied":  # one tied weight in both exports, the same values
        got, want = (load_safetensors(runs[r] / "model.safetensors") for r in (run, ref))
        assert set(got) == set(want) and got["output.weight"] is got["tok_embeddings.weight"]
        for k, v in want.items():
            assert torch.allclose(got[k], v, atol=1e-5), k


@pytest.mark.parametrize(("run", "stages", "check"),
                         [("tied2", 2, 0), pytest.param("tied4", 4, 8, marks=pytest.mark.slow)])  # tied4: checksum
def test_tied_exchange_bytes_equal_hand_counts(runs, run: str, stages: int, check: int) -> None:
    """Stage 0 sends its embedding gradient on the step's distinct ids, stage P − 1 the dense head gradient,
    exact fp32, counted as kind ``tied`` at link P − 1; the checksum at step 2 adds 8 bytes each way."""
    from slimpar.train.build import build_data
    from slimpar.train.validate.checks import load_run_config
    from tests.helpers import TINY

    cfg = load_run_config(TINY, ["--model.tie_embeddings", "true"])
    x, _ = build_data(cfg).train_batch(2, 0, 1, B, T)  # the instrumented step (log.measure_step = 2)
    V, u, activation = cfg.data.vocab_size, len(torch.unique(x)), B * T * D * 4
    s = summary(runs[run])
    link = f"b{stages - 1}"  # the tied link is counted as link P − 1
    tied = {0: {f"{link}_fwd_tied": u * D * 4 + check}, stages - 1: {f"{link}_bwd_tied": V * D * 4 + check}}
    for stage, record in enumerate(s["per_rank"]):
        assert _sends(record) == record["pipeline_bytes_sent"]  # counted at the send, c10d agrees
        payload = {f"b{stage}_fwd_payload": activation} if stage < stages - 1 else {}
        if stage > 0:
            payload[f"b{stage - 1}_bwd_payload"] = activation
        assert record["pipeline_bytes_by_key"] == {**payload, **tied.get(stage, {})}, (run, stage)
    assert s["shared_param_resyncs"] == 0
    # the summary reports the tied exchange apart: a mean over the 3 steps' distinct ids, the dense head
    steps = s["pipeline_train_steps_counted"]
    u_mean = sum(len(torch.unique(build_data(cfg).train_batch(k, 0, 1, B, T)[0])) for k in range(steps)) / steps
    assert s["tied_bytes_per_step_fwd"] == pytest.approx(u_mean * D * 4 + check / steps)
    assert s["tied_bytes_per_step_bwd"] == pytest.approx(V * D * 4 + check / steps)
    for d in ("fwd", "bwd"):
        assert s[f"boundary_bytes_per_step_{d}"] + s[f"tied_bytes_per_step_{d}"] == s[f"comm_bytes_per_step_{d}"]
    assert s["compression_ratio_boundary"] == 1.0 > s["compression_ratio"]  # codec none: only the tie costs


def test_bytes_counted_at_the_send_equal_c10d_and_hand_counts(runs) -> None:
    s = summary(runs["none"])
    activation = B // 2 * T * D * 4  # a replica's half batch at the boundary, float32
    assert [r["pipeline_bytes_by_key"] for r in s["per_rank"]] == [
        {"b0_fwd_payload": activation}, {"b0_bwd_payload": activation}] * 2  # rank = replica × 2 + stage
    for record in s["per_rank"]:
        assert _sends(record) == record["pipeline_bytes_sent"]
    assert s["comm_bytes_per_step_fwd"] == s["comm_bytes_per_step_bwd"] == activation  # per pipeline
    assert s["compression_ratio"] == 1.0 and s["max_orth_error"] == 0.0


def test_compressed_pipeline_keeps_both_copies_identical_and_counts_every_byte(runs) -> None:
    from slimpar.train.build import build_data
    from slimpar.train.validate.checks import load_run_config
    from tests.helpers import TINY

    s = summary(runs["mapl_rvq"])
    model = load_safetensors(runs["mapl_rvq"] / "model.safetensors")
    for b in range(2):
        A = model[f"codecs.send{b}.projector.A"]
        assert torch.equal(A, model[f"codecs.recv{b}.projector.A"])
        assert torch.equal(model[f"codecs.send{b}.anchor.E"], model[f"codecs.recv{b}.anchor.E"])
        assert torch.linalg.matrix_norm(A.double().T @ A.double() - torch.eye(16, dtype=torch.float64)) <= 1e-5
    assert 0 < s["max_orth_error"] <= 1e-5 and s["shared_param_resyncs"] == 0
    assert s["codebook_messages"]["full"] == 4  # 2 boundaries × steps 0 and 2
    cfg = load_run_config(TINY, ["--model.tie_embeddings", "false"])
    x, _ = build_data(cfg).train_batch(2, 0, 1, B, T)  # the instrumented step (log.measure_step = 2)
    distinct = len(torch.unique(x))
    # int8 gradient parts with a float32 scale per row: A (D×16) and the anchor rows of distinct ids
    # (distinct × 8), plus the 8-byte digests of A and E (checksum at step 2)
    sync = D * 16 + D * 4 + distinct * 8 + distinct * 4 + 2 * 8
    for stage, record in enumerate(s["per_rank"]):
        assert _sends(record) == record["pipeline_bytes_sent"]  # counted at the send, c10d agrees
        keys = record["pipeline_bytes_by_key"]
        if stage < 2:  # sender of boundary `stage`: packed indices, ids, codebook rows, A / E parts, digests
            assert keys[f"b{stage}_fwd_payload"] == 4 * math.ceil(B // 4 * T * 2 * 6 / 8)
            assert keys[f"b{stage}_fwd_ids"] == B * T * 2
            assert keys[f"b{stage}_fwd_codebook"] >= 4 * 32
            assert keys[f"b{stage}_fwd_sync"] == sync
        if stage > 0:  # receiver of boundary stage − 1: r float32 gradients per token
            assert keys[f"b{stage - 1}_bwd_payload"] == B * T * 16 * 4
            assert keys[f"b{stage - 1}_bwd_sync"] == sync
    assert math.isfinite(s["val_loss"]) and s["compression_ratio"] > 4


def test_compressed_pipeline_resumes_exactly(runs, tmp_path) -> None:
    """2 steps, a DCP checkpoint, then the 3rd step on resume == the 3 straight steps above: MAPL
    projectors (SPEL momentum), anchors, RVQ codebooks (EMA statistics, the receiver's streamed copy
    and version; step 2 sends a full table) and the checksum all carry across. Each stage's codec
    halves have their own names, so DCP keeps both copies of a shared parameter and their states."""
    split = tmp_path / "split"
    run_train(split, *COMMON, *RUNS["mapl_rvq"], "--train.stop_after", "2", timeout=300)
    assert len(losses(split)) == 2
    run_train(split, *COMMON, *RUNS["mapl_rvq"], resume=True, timeout=300)
    assert losses(split) == losses(runs["mapl_rvq"])
    assert summary(split)["val_loss"] == summary(runs["mapl_rvq"])["val_loss"]
