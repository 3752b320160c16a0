"""``--log.mlflow true``: a run stopped after 2 steps and resumed logs into one MLflow run of the local file
store ``OUT/mlruns``, offline; read back with MLflow's own client, its metrics equal metrics.jsonl and
summary.json, and its params are the resolved config."""

import json

import pytest

from tests.helpers import run_train

mlflow = pytest.importorskip("mlflow")

ARGS = ("--train.steps", "4", "--log.every", "1", "--eval.batches", "1", "--data.ood", "none",
        "--checkpoint.export", "false", "--log.mlflow", "true")


@pytest.fixture(scope="module")
def client_and_run(tmp_path_factory, monkeypatch_module):
    from mlflow.tracking import MlflowClient

    from slimpar.train.sinks.mlflow_sink import store_uri

    out = tmp_path_factory.mktemp("mlflow") / "run"
    run_train(out, *ARGS, "--train.stop_after", "2")
    run_train(out, *ARGS, resume=True)
    monkeypatch_module.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=store_uri(out))
    (run,) = client.search_runs([client.get_experiment_by_name("slimpar").experiment_id])
    return client, run, out


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_metrics_equal_the_metrics_file_across_a_resume(client_and_run):
    client, run, out = client_and_run
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for key in ("loss", "lr", "grad_norm", "step_time_s"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, f"train/{key}"))
        assert history == [(r["step"], pytest.approx(r[key], rel=1e-12)) for r in records], key
    summary = json.loads((out / "summary.json").read_text())
    assert run.data.metrics["summary/val_loss"] == pytest.approx(summary["val_loss"], rel=1e-12)
    assert {"summary/peak_mem_bytes", "summary/memory_params_bytes"} <= set(run.data.metrics)


def test_params_are_the_config_and_the_run_finished(client_and_run):
    _, run, out = client_and_run
    params = run.data.params
    assert params["train.steps"] == "4" and params["model.arch"] == "llama" and params["log.mlflow"] == "True"
    assert params["train.stop_after"] == "2"  # the first invocation's config; a resume logs no params
    assert run.info.status == "FINISHED" and run.info.run_name == out.name
