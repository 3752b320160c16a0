"""``train.compile`` breaks no graph and compiles nothing new after the second step, in every mode it applies to
and every ``train.compile_scope`` a mode takes (summary.json's ``compile``: dynamo's counters, per rank, summed).

The ``eager`` backend: dynamo's capture, guards and breaks are the same as inductor's, without its codegen."""

import pytest

from tests.helpers import VIRTUAL_PIPELINE, run_train, summary

STEPS = ["--train.steps", "4", "--log.every", "1", "--eval.batches", "1", "--data.ood", "none",
         "--checkpoint.export", "false", "--checkpoint.final", "false", "--train.compile", "true",
         "--train.compile_backend", "eager"]
VIRTUAL_SDP = ["--parallel.mode", "sdp", "--sdp.virtual", "true", "--sdp.virtual_workers", "4"]
MODES = {
    "single": [],
    "single, loss": ["--train.compile_scope", "loss"],
    "single, model, bf16": ["--train.compile_scope", "model", "--train.dtype", "bf16"],
    "virtual B-SDP, model": [*VIRTUAL_SDP, "--train.compile_scope", "model"],
    "batched Bb-SDP, loss": [*VIRTUAL_SDP, "--sdp.virtual_batched", "true", "--sdp.regime", "backward",
                             "--train.compile_scope", "loss"],
    "virtual pipeline MAPL + RVQ, loss": [*VIRTUAL_PIPELINE, "--pipeline.codec", "mapl", "--pipeline.rvq.levels", "2",
                                          "--train.compile_scope", "loss"],
    "DDP, loss": ["--parallel.mode", "ddp", "--parallel.workers", "2", "--train.compile_scope", "loss"],
    "FSDP2, loss": ["--parallel.mode", "fsdp", "--parallel.workers", "2", "--train.compile_scope", "loss"],
    "Bb-SDP, loss": ["--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.regime", "backward",
                     "--train.compile_scope", "loss"],
    "pipeline x SDP": ["--parallel.mode", "pipeline", "--parallel.workers", "4", "--pipeline.stages", "2",
                       "--pipeline.dp", "sdp", "--pipeline.codec", "mapl"],
}


@pytest.mark.parametrize("mode", list(MODES))
def test_no_graph_breaks_and_no_recompiles_after_step_two(tmp_path, mode):
    run_train(tmp_path, *STEPS, *MODES[mode], timeout=600)
    counts = summary(tmp_path)["compile"]
    assert counts["graph_breaks"] == 0, counts["graph_break_reasons"]
    assert counts["graphs_after_warmup"] == 0, counts
    assert all(r["compile"]["graphs"] >= 1 for r in summary(tmp_path)["per_rank"])  # it did compile


def test_compiled_blocks_run_after_the_instrumented_step(tmp_path, monkeypatch):
    """The instrumented step (a dispatch mode) runs eager; before the fix dynamo then gave up on the blocks' code
    and every later step ran eager too (the trainer kept none of compile's gain)."""
    import torch

    import slimpar.parallel.compile as compile_module
    from slimpar.train.job.context import RunContext
    from slimpar.train.trainer import Trainer
    from slimpar.train.validate.checks import load_run_config
    from tests.helpers import TINY

    calls: list[int] = []

    def backend(gm, inputs):
        def run(*args):
            calls.append(1)
            return gm.forward(*args)
        return run

    monkeypatch.setattr(compile_module, "apply_compile",
                        lambda blocks, _backend: [b.compile(backend=backend) for b in blocks.values()])
    cfg = load_run_config(TINY, [*STEPS, "--train.steps", "5"])  # step 3 of 5 is instrumented (log.measure_step 2)
    trainer = Trainer(cfg, RunContext(0, 1, torch.device("cpu"), tmp_path, None))
    per_step: list[int] = []
    after = trainer._after_step
    monkeypatch.setattr(trainer, "_after_step", lambda step, *a: (per_step.append(len(calls)), after(step, *a)))
    trainer.run()
    blocks = 4
    assert per_step == [blocks, 2 * blocks, 2 * blocks, 3 * blocks, 4 * blocks]
