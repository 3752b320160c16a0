"""sdp.memory_budget on a model the analytic activation model does not describe (ResNet-18 with BatchNorm,
channel-level SDP): the launcher chooses each worker's keep against the FakeTensorMode prediction, and a
real gloo run's measured peaks equal the prediction and fit the budgets.

Budgets: 4.7 MiB (worker 0: the whole model's channels, 4.69 MB predicted) and 3.5 MiB (worker 1: 3.81 MiB
predicted at keep 0.75, 3.15 MiB at keep 0.5), so the search goes 1 -> 0.75 -> 0.5
for worker 1."""

import json

import pytest

from tests.distributed.test_memory_predict_models import RESNET
from tests.helpers import run_train, summary

ARGS = ["--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.level", "neuron", "--sdp.memory_budget",
        "4.7MiB,3.5MiB", "--train.steps", "3", "--eval.batches", "1", "--checkpoint.export", "false",
        "--checkpoint.final", "false"]


@pytest.mark.slow
def test_predicted_budget_chooses_keeps_that_fit(tmp_path):
    run_train(tmp_path / "run", *ARGS, config=RESNET, timeout=600)
    s = summary(tmp_path / "run")
    mem, budgets = s["sdp_memory"], [int(4.7 * 2**20), int(3.5 * 2**20)]
    record = json.loads((tmp_path / "run" / "memory_budget.json").read_text())
    assert mem["model"] == "predicted" and mem["budgets"] == budgets
    assert s["sdp_plan"]["keep_per_worker"] == [1.0, 0.5]
    assert record["searched"] == [[1.0, 1.0], [1.0, 0.75], [1.0, 0.5]]  # 0.75 did not fit worker 1
    measured = [r["mem"] for r in s["per_rank"]]
    for i, m in enumerate(measured):
        assert m["peak_live"] <= budgets[i]
        assert mem["predicted_peak_mem_bytes"][i] == pytest.approx(m["peak_live"], rel=0.01), i
        pred = mem["predicted_per_rank"][i]
        assert all(pred[f] == pytest.approx(m[f], rel=0.01) for f in ("params", "grads", "optimizer", "activations"))
    print(json.dumps({"keeps": s["sdp_plan"]["keep_per_worker"], "predicted": mem["predicted_peak_mem_bytes"],
                      "measured": [m["peak_live"] for m in measured], "budgets": budgets}))
