"""Virtual SDP and real SDP resume each other's checkpoints (``slimpar train``, tiny LLaMA, 2 workers; 4: slow).

Both write the full-name format (one copy of every tensor under the model's own names, AdamW state keyed
by parameter name). Neuron level, backward regime: sliced tensors, held/frozen splits and the refresh.
Each direction: 1 step of one kind, a planned stop, then ``--resume`` as the other kind for steps 2 and
3, compared with the uninterrupted 3 steps of the kind that resumes. Bitwise: virtual SDP adds every
holder group's gradients in gloo's ring order (tests/distributed/test_sdp_virtual.py), the checkpoint
carries every parameter and AdamW state exactly, and each worker takes back the slices it held; the
logged loss of the stopped step comes from the other kind (the mean of the same workers' losses).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slimpar.train.checkpoint.folders import latest_checkpoint
from tests.helpers import assert_same_run, run_train, stop_and_resume

COMMON = ["--parallel.mode", "sdp", "--train.steps", "3", "--eval.batches", "1", "--data.ood", "none",
          "--checkpoint.final", "false", "--sdp.check_every", "1", "--sdp.level", "neuron",
          "--sdp.regime", "backward"]
SLOW = pytest.mark.slow  # 4 processes on a 2-core machine
CASES = [("virtual", "real", 2), pytest.param("real", "virtual", 2, marks=SLOW),  # default: one direction
         pytest.param("virtual", "real", 4, marks=SLOW), pytest.param("real", "virtual", 4, marks=SLOW)]


def kind(name: str, workers: int) -> list[str]:
    if name == "real":
        return ["--parallel.workers", str(workers)]
    return ["--parallel.workers", "1", "--sdp.virtual", "true", "--sdp.virtual_workers", str(workers)]


@pytest.mark.parametrize(("first", "then", "workers"), CASES)
def test_sdp_resumes_across_virtual_and_real(tmp_path: Path, first: str, then: str, workers: int) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    run_train(straight, *COMMON, *kind(then, workers))
    stop_and_resume(split, [*COMMON, *kind(first, workers)], [*COMMON, *kind(then, workers)])
    assert json.loads((latest_checkpoint(split) / "layout.json").read_text())["names"] == "full"
    assert_same_run(split, straight)
