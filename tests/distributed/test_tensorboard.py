"""``--log.tensorboard true``: loss, lr, grad norm, step time per step and memory and bytes at the end;
and every step's own step time in metrics.jsonl (one run checks both)."""

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers import run_train


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tensorboard") / "run"
    run_train(out, "--train.steps", "4", "--log.every", "1", "--eval.batches", "1", "--data.ood", "none",
              "--checkpoint.export", "false", "--log.tensorboard", "true", "--log.progress", "false")
    return out


def test_tensorboard_scalars_equal_the_metrics_file(run):
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for key in ("loss", "lr", "grad_norm", "step_time_s"):
        logged = [(e.step, e.value) for e in events.Scalars(f"train/{key}")]
        assert logged == [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in records], key  # float32
    summary = json.loads((run / "summary.json").read_text())
    assert {"summary/peak_mem_bytes", "summary/comm_bytes_per_step", "summary/memory_params_bytes"} <= tags
    assert events.Scalars("summary/val_loss")[0].value == pytest.approx(summary["val_loss"], rel=1e-6)


def test_every_step_has_its_own_time(run):
    """The instrumented step reports its own (slower) time, not the previous step's."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time_s"] for r in records]
    assert all(t > 0 for t in times) and len(set(times)) == len(times)
    assert [r.get("instrumented", False) for r in records] == [False, False, True, False]  # log.measure_step 2
