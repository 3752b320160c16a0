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


MAPL_RVQ = ["--eval.batches", "1", "--data.ood", "none", "--parallel.mode", "pipeline", "--pipeline.schedule", "gpipe",
            "--pipeline.microbatches", "2", "--model.tie_embeddings", "true", "--pipeline.codec", "mapl",
            "--pipeline.rank", "16", "--pipeline.rvq.levels", "2", "--pipeline.rvq.codebook", "32",
            "--checkpoint.final", "false"]


def _checkpoint_state(path: Path) -> dict:
    """A DCP checkpoint's entries by name, read in this process (our own files: a plain torch.save)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(path, path.parent / "flat.pt")
    nested = torch.load(path.parent / "flat.pt", weights_only=False)  # {"model": {...}, "optim": {...}}
    return {f"{part}.{k}": v for part, entries in nested.items() for k, v in entries.items()}


def _assert_export_is_checkpoint(exported: dict, saved: dict) -> None:
    """Every exported tensor equals the checkpoint's entry: a codec's halves send0 / recv0 are the cut after
    block 1 (``model.codecs.cut1.send`` / ``.recv``), the rest are model weights under their full names."""
    import torch

    for name, t in exported.items():
        if name.startswith("codecs."):
            half, rest = name[len("codecs."):].split(".", 1)
            key = f"model.codecs.cut1.{'send' if half == 'send0' else 'recv'}.{rest}"
        else:
            key = f"model.{name}"
        assert torch.equal(t, saved[key]), name


@pytest.mark.slow  # 4 + 2 local processes (~100 s on 2 cores)
def test_four_stage_checkpoint_resumes_on_two_stages(tmp_path: Path) -> None:
    """4 stages (4 workers) stopped after step 2; resumed on 2 stages (2 workers) with ``--train.steps 2`` (no
    step, only the load, evaluation and export): the exported model is the checkpoint's, weight for weight;
    the codec of the cut after block 1 (the 2-stage run's only cut) is the checkpoint's; the run says so."""

    from slimpar.train.checkpoint.export import load_safetensors
    from tests.helpers import summary

    out = tmp_path / "run"
    run_train(out, *MAPL_RVQ, "--pipeline.stages", "4", "--parallel.workers", "4", "--train.steps", "3",
              "--train.stop_after", "2", timeout=300)
    saved = _checkpoint_state(out / "checkpoints" / "step_000002")
    proc = run_train(out, *MAPL_RVQ, "--pipeline.stages", "2", "--parallel.workers", "2", "--train.steps", "2",
                     "--allow-change", resume=True, timeout=300)
    for line in ("4 stages -> 2", "boundary after block 1: codec state kept",
                 "boundary after block 0: no longer a cut", "boundary after block 2: no longer a cut"):
        assert line in proc.stdout, line
    exported = load_safetensors(out / "model.safetensors")
    _assert_export_is_checkpoint(exported, saved)
    weights = {k[len("model."):] for k in saved if k.startswith("model.") and not k.startswith("model.codecs.")}
    assert {n for n in exported if not n.startswith("codecs.")} == weights
    assert summary(out)["pipeline_resume"] == {"checkpoint_stages": 4, "stages": 2, "dropped_cuts": [0, 2],
                                               "boundaries": [{"after_block": 1, "codec_state": "kept"}]}


@pytest.mark.slow  # ~50 s; tests/unit/test_pipeline_reshard.py checks the same 2 -> 4 load in-process
def test_a_virtual_run_resumes_on_more_stages_restarting_its_new_cuts(tmp_path: Path) -> None:
    """The trainer's path in one process: 2 virtual stages stopped after step 2, resumed on 4 (the new cuts get a
    PCA start and fresh codebooks before step 3, the kept cut keeps its codec); the run and summary.json say which."""
    from tests.helpers import summary

    out, virtual = tmp_path / "run", [*MAPL_RVQ, "--pipeline.virtual", "true", "--train.steps", "3"]
    stop_and_resume(out, [*virtual, "--pipeline.stages", "2"], [*virtual, "--pipeline.stages", "4"], stop_after=2)
    states = [b["codec_state"] for b in summary(out)["pipeline_resume"]["boundaries"]]
    assert states == ["restarted", "kept", "restarted"]
    assert len(losses(out)) == 3


@pytest.mark.slow  # 4 + 2 local processes (~100 s on 2 cores)
def test_hybrid_replicas_shrink_from_four_workers_to_two(tmp_path: Path) -> None:
    """What an elastic job that loses a node does to the hybrid (2 stages x 2 SDP replicas at keep 0.5): it
    restarts on 2 workers (one replica per stage) from the newest checkpoint. Resumed with no step left, the
    export is the checkpoint's model weight for weight, its boundary codec included, and the change is recorded."""

    from slimpar.train.checkpoint.export import load_safetensors
    from tests.helpers import summary

    hybrid = [*MAPL_RVQ, "--pipeline.stages", "2", "--pipeline.dp", "sdp", "--pipeline.sdp_keep", "0.5"]
    out = tmp_path / "run"
    run_train(out, *hybrid, "--parallel.workers", "4", "--train.steps", "3", "--train.stop_after", "2", timeout=300)
    saved = _checkpoint_state(out / "checkpoints" / "step_000002")
    proc = run_train(out, *hybrid, "--parallel.workers", "2", "--train.steps", "2", "--allow-change", resume=True,
                     timeout=300)
    assert "resuming from step 2" in proc.stdout, proc.stdout[-3000:]
    exported = load_safetensors(out / "model.safetensors")
    _assert_export_is_checkpoint(exported, saved)
    s = summary(out)
    assert [(m["step"], m["old_world"], m["new_world"]) for m in s["membership"]] == [(2, 4, 2)]


@pytest.mark.slow  # 4 + 2 + 4 local processes (~58 s on 2 cores); tests/unit/test_pipeline_kept_rank.py holds the rule
def test_an_automatic_rank_survives_losing_a_replica(tmp_path: Path) -> None:
    """The hybrid at the default compression (4 of every byte, r automatic) loses a replica: on 4 workers r = 14,
    on 2 the same settings choose r = 15 (tests/unit/test_pipeline_kept_rank.py), so the resumed run keeps the
    checkpoint's r (it could not load its codecs otherwise), says so, and grows back to 4 workers with that r."""
    hybrid = ["--eval.batches", "1", "--data.ood", "none", "--parallel.mode", "pipeline", "--pipeline.stages", "2",
              "--pipeline.microbatches", "2", "--pipeline.codec", "mapl", "--pipeline.dp", "sdp",
              "--pipeline.sdp_keep", "0.5", "--checkpoint.final", "false", "--train.steps", "4"]
    out = tmp_path / "run"
    run_train(out, *hybrid, "--parallel.workers", "4", "--train.stop_after", "2", timeout=300)
    shrunk = run_train(out, *hybrid, "--parallel.workers", "2", "--train.stop_after", "3", resume=True, timeout=300)
    assert "keeps its checkpoint's codec rank r = 14" in shrunk.stdout, shrunk.stdout
    assert "resuming from step 2" in shrunk.stdout and "r = 14 of d = 64" in shrunk.stdout
    grown = run_train(out, *hybrid, "--parallel.workers", "4", resume=True, timeout=300)
    assert "resuming from step 3" in grown.stdout and "r = 14 of d = 64" in grown.stdout, grown.stdout
    assert len(losses(out)) == 4
