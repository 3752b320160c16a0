"""``slimpar plan --memory`` for pipelines against the exact accounting of real runs (configs/llama_tiny.toml,
3 steps, step 2 measured): 4 gloo workers, one stage each, per codec, and the virtual pipeline (every stage in
one worker). Every field of every worker is compared: equal to the byte, except where RVQ is on, whose
codebook messages the prediction takes at their worst case (every row sent: docs/memory.md), so a real run
may hold a little less at its peak (predicted >= measured, within 1 %).

The default suite checks the virtual 2-stage MAPL pipeline in this process (a run and a prediction: ~9 s of
CPU, 17-24 s of wall time on the shared 2-core machine under load); the 4-worker cases (80-150 s each there)
are marked slow."""

import json

import pytest
import torch

from tests.distributed.test_memory_predict import QUIET, predict
from tests.helpers import TINY, run_train, summary

FIELDS = ("params", "grads", "optimizer", "buffers", "activations", "peak_live", "peak_step_alloc")
SHORT = ["--train.steps", "3"]  # measured at log.measure_step 2
FOUR = ["--parallel.mode", "pipeline", "--parallel.workers", "4", "--pipeline.stages", "4"]
RVQ = ["--pipeline.codec", "mapl", "--pipeline.rvq.levels", "2"]
SLOW_MODES = {
    "none": FOUR,
    "mapl": [*FOUR, "--pipeline.codec", "mapl"],
    "mapl-rvq": [*FOUR, *RVQ],
    "int8": [*FOUR, "--pipeline.codec", "int8"],
    "mapl-factorized-untied": [*FOUR, "--pipeline.codec", "mapl", "--pipeline.anchors", "factorized",
                               "--model.tie_embeddings", "false"],
    "virtual-mapl-rvq": ["--parallel.mode", "pipeline", "--parallel.workers", "1", "--pipeline.stages", "4",
                         "--pipeline.virtual", "true", *RVQ],
}


def check_same(measured: list[dict], predicted: list[dict], worst_case: bool) -> None:
    """Every field of every worker: equal, or (``worst_case``) measured <= predicted <= 1.01 x measured."""
    print(json.dumps([{f: (m[f], p[f]) for f in FIELDS} for m, p in zip(measured, predicted, strict=True)]))
    for m, p in zip(measured, predicted, strict=True):
        for field in FIELDS:
            if worst_case:
                assert m[field] <= p[field] <= m[field] * 1.01, (p["rank"], field, m[field], p[field])
            else:
                assert p[field] == m[field], (p["rank"], field, m[field], p[field])


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(SLOW_MODES))
def test_pipeline_prediction_equals_measurement(tmp_path, mode):
    args = SLOW_MODES[mode]
    run_train(tmp_path / "run", *SHORT, *QUIET, *args, timeout=300)
    measured = [r["mem"] for r in summary(tmp_path / "run")["per_rank"]]
    check_same(measured, predict(*SHORT, *args), worst_case="--pipeline.rvq.levels" in args)


def test_virtual_pipeline_prediction_equals_measurement(tmp_path):
    """In this process: a real 2-stage virtual MAPL run (tied embeddings: the tied exchange's rows are the
    batch's distinct ids), 2 steps, step 1 measured (step 0 is the PCA start), then the prediction of its
    one worker."""
    from slimpar.config import load_config
    from slimpar.train.job.context import RunContext
    from slimpar.train.memory.predict import predict_memory
    from slimpar.train.trainer import Trainer

    args = ["--train.steps", "2", "--log.measure_step", "1", *QUIET, "--parallel.mode", "pipeline",
            "--parallel.workers", "1", "--pipeline.stages", "2", "--pipeline.virtual", "true",
            "--pipeline.codec", "mapl"]
    cfg = load_config(TINY, args)
    trainer = Trainer(cfg, RunContext(0, 1, torch.device("cpu"), tmp_path, None))
    trainer.run()
    check_same([trainer.measured["mem"]], predict_memory(cfg), worst_case=False)
