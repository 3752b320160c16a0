"""The memory prediction against real 2-worker runs of the 134m LLaMA at batch 2 x seq 256 (one sequence
per worker), 3 steps (the third measured): DDP and B-SDP at keep 0.5. Each real run holds about 2.5 GB per worker."""

import pytest

from tests.distributed.test_memory_predict import check_same, predict
from tests.helpers import run_train, summary

ARGS = ["--model.size", "134m", "--parallel.workers", "2", "--train.batch_size", "2", "--data.seq_len", "256",
        "--train.steps", "3"]  # measured at step 2 (log.measure_step)
QUIET = ["--eval.batches", "1", "--eval.batch_size", "2", "--data.ood", "none", "--checkpoint.export", "false",
         "--checkpoint.final", "false"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--parallel.mode", "ddp"], ["--parallel.mode", "sdp", "--sdp.keep", "0.5"]],
                         ids=["ddp", "sdp-block"])
def test_prediction_equals_measurement_134m(tmp_path, mode):
    run_train(tmp_path / "run", *ARGS, *QUIET, *mode, timeout=1200)
    check_same(summary(tmp_path / "run"), predict(*ARGS, *mode, timeout=600))
