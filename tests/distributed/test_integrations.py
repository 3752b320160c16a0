"""SDP inside transformers.Trainer (slimpar.integrations.hf.SDPTrainer), a plain Accelerate loop and PyTorch
Lightning (slimpar.integrations.lightning.SDPStrategy), 2 gloo ranks under torchrun, against independent
references: each stack's own DDP (keep 1), and ``slimpar train`` on the same initial weights (a HF folder through
--model.init_from), batches, seed and keep (keep 0.5, 5 steps, 2 micro-batches per step, clipping at 1.0, cosine
schedule to a floor). One slimpar run and two torchrun scripts (tests/distributed/scripts/hf_integration.py,
lightning_integration.py) serve every test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, losses, run_train

SCRIPTS = ROOT / "tests" / "distributed" / "scripts"
STEPS = 5
SLIMPAR = ["--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.keep", "0.5", "--sdp.check_every", "1",
           "--train.steps", str(STEPS), "--train.grad_accum", "2", "--train.warmup_steps", "0", "--eval.batches", "1",
           "--data.ood", "none", "--checkpoint.final", "false", "--checkpoint.export", "false"]


def write_hf_llama(folder) -> None:
    """A tiny random LlamaForCausalLM saved as a HF folder (no download); its vocabulary covers the tiny run's."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=4,
                                 max_position_embeddings=128)).save_pretrained(folder)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """(folder with the HF model ``hf`` and ``overrides.json``, the slimpar run folder)."""
    root = tmp_path_factory.mktemp("integrations")
    write_hf_llama(root / "hf")
    overrides = [*SLIMPAR, "--model.init_from", str(root / "hf")]
    run_train(root / "slimpar", *overrides)
    (root / "overrides.json").write_text(json.dumps(overrides))
    return root, root / "slimpar"


def torchrun(script: str, root, prefix: str) -> list[dict]:
    """``script`` on 2 ranks with (work folder, HF folder, overrides); each rank's ``{prefix}{rank}.json``."""
    work = root / "work"
    work.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(SCRIPTS / script), str(work), str(root / "hf"), str(root / "overrides.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads((work / f"{prefix}{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def runs(prepared):
    """(slimpar run folder, [rank 0's HF results, rank 1's])."""
    return prepared[1], torchrun("hf_integration.py", prepared[0], "rank")


@pytest.fixture(scope="module")
def lightning_runs(prepared):
    """(slimpar run folder, [rank 0's Lightning results, rank 1's])."""
    return prepared[1], torchrun("lightning_integration.py", prepared[0], "lightning")


def _both(runs, *keys):
    """The same value from both ranks (losses are means over ranks, so both log the same)."""
    got = []
    for r in runs[1]:
        for k in keys:
            r = r[k]
        got.append(r)
    assert got[0] == got[1]
    return got[0]


def test_trainer_keep_one_equals_trainer_ddp(runs):
    """SDPTrainer given a model wrapped in slimpar.SubnetworkDataParallel (keep 1) against Trainer's own DDP."""
    ddp, sdp = _both(runs, "trainer", "ddp", "loss"), _both(runs, "trainer", "sdp1", "loss")
    assert len(ddp) == len(sdp) == STEPS
    assert max(abs(a - b) for a, b in zip(sdp, ddp, strict=True)) <= 1e-5
    assert _both(runs, "trainer", "sdp1", "grad_norm") == pytest.approx(_both(runs, "trainer", "ddp", "grad_norm"),
                                                                         rel=1e-5)


def test_trainer_sdp_equals_slimpar_trainer(runs):
    """keep 0.5: the cut is real (a rank holds 3 of 4 blocks) and every step's loss equals slimpar's trainer's."""
    want, got = losses(runs[0]), _both(runs, "trainer", "sdp05", "loss")
    assert len(got) == len(want) == STEPS
    assert got == pytest.approx(want, rel=1e-5)
    assert got[-1] != pytest.approx(_both(runs, "trainer", "ddp", "loss")[-1], rel=1e-4)  # not DDP in disguise
    assert runs[1][0]["trainer"]["plan_mask"] == [[1, 1, 1, 0], [0, 0, 1, 1]]
    assert runs[1][0]["trainer"]["held_blocks"] == 3
    records = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    norms = [r["grad_norm"] for r in records if "kind" not in r]
    assert _both(runs, "trainer", "sdp05", "grad_norm") == pytest.approx(norms, rel=1e-5)
    assert max(norms) > 1.0  # clipping at 1.0 acted


def test_trainer_resumes_from_its_checkpoint(runs):
    """Resumed from checkpoint-3 (full model, per-rank optimizer, scheduler, RNG), steps 4-5 and the final model
    equal the uninterrupted run's."""
    assert _both(runs, "trainer", "resumed", "loss") == _both(runs, "trainer", "sdp05", "loss")[3:]
    assert _both(runs, "trainer", "resume_param_diff") == 0.0


def test_trainer_saves_the_full_model_for_from_pretrained_and_evaluates_it(runs):
    t = runs[1][0]["trainer"]
    assert t["from_pretrained_diff"] == 0.0 and t["saved_layers"] == t["loaded_layers"] == 4
    assert t["eval_loss"] == pytest.approx(t["eval_direct"], rel=1e-6)


def test_accelerate_loop_keep_one_equals_ddp_and_keep_half_equals_slimpar(runs):
    ddp, sdp1 = _both(runs, "accelerate", "ddp"), _both(runs, "accelerate", "sdp1")
    assert len(ddp) == STEPS and max(abs(a - b) for a, b in zip(sdp1, ddp, strict=True)) <= 1e-5
    assert _both(runs, "accelerate", "sdp05") == pytest.approx(losses(runs[0]), rel=1e-5)


def test_plain_trainer_with_an_sdp_model_stops_with_a_clear_error(runs):
    assert "sync() was not called" in _both(runs, "plain_trainer_error")
    assert "SDPTrainer" in _both(runs, "plain_trainer_error")


def test_lightning_keep_one_equals_lightning_ddp(lightning_runs):
    """Every micro-batch's loss on each rank, SDPStrategy(keep 1) against Lightning's DDPStrategy."""
    for r in lightning_runs[1]:
        assert len(r["ddp"]) == len(r["sdp1"]) == 2 * STEPS
        assert max(abs(a - b) for a, b in zip(r["sdp1"], r["ddp"], strict=True)) <= 1e-5


def test_lightning_sdp_equals_slimpar_trainer_and_resumes_saves_and_validates(lightning_runs):
    got = _both(lightning_runs, "sdp05")
    assert got == pytest.approx(losses(lightning_runs[0]), rel=1e-5)
    r = lightning_runs[1][0]
    assert r["held_blocks"] == 3
    assert _both(lightning_runs, "resumed") == got[3:] and r["resume_param_diff"] == 0.0  # from the step-3 checkpoint
    assert r["load_diff"] == 0.0  # load_from_checkpoint gives the full model
    assert r["val_loss"] == pytest.approx(r["val_direct"], rel=1e-6)  # validated on the gathered full model
