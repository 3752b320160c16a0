"""``--log.tensorboard true``: loss, lr, grad norm, step time per step and memory and bytes at the end."""

import json

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers import run_train


def test_tensorboard_scalars_equal_the_metrics_file(tmp_path):
    out = tmp_path / "run"
    run_train(out, "--train.steps", "4", "--log.every", "1", "--eval.batches", "1", "--data.ood", "none",
              "--checkpoint.export", "false", "--log.tensorboard", "true", "--log.progress", "false")
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for key in ("loss", "lr", "grad_norm", "step_time_s"):
        logged = [(e.step, e.value) for e in events.Scalars(f"train/{key}")]
        assert logged == [(r["step"], pytest_approx(r[key])) for r in records], key
    summary = json.loads((out / "summary.json").read_text())
    assert {"summary/peak_mem_bytes", "summary/comm_bytes_per_step", "summary/memory_params_bytes"} <= tags
    assert events.Scalars("summary/val_loss")[0].value == pytest_approx(summary["val_loss"])


def pytest_approx(value: float):
    import pytest

    return pytest.approx(value, rel=1e-6)  # TensorBoard stores float32


def test_every_step_has_its_own_time(tmp_path):
    """The instrumented step reports its own (slower) time, not the previous step's."""
    out = tmp_path / "run"
    run_train(out, "--train.steps", "4", "--log.every", "1", "--eval.batches", "1", "--data.ood", "none",
              "--checkpoint.export", "false", "--checkpoint.final", "false", "--log.progress", "false")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time_s"] for r in records]
    assert all(t > 0 for t in times) and len(set(times)) == len(times)
    assert [r.get("instrumented", False) for r in records] == [False, False, True, False]  # log.measure_step 2
