"""Optional MLflow sink (``log.mlflow = true``): the run's config as params, the numbers of ``metrics.jsonl`` as
``train/<name>`` at their steps and those of ``summary.json`` as ``summary/<name>``, written by rank 0 into an
MLflow file store inside the run folder (``OUT/mlruns``, experiment ``slimpar``): offline, no server.

MLflow 3 keeps its file store in maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE=true``, which this sink sets
for its own process when the user has not set it. A resumed run continues the store's MLflow run (its params are
not logged again: MLflow refuses a changed param), so steps redone after the checkpoint appear twice in a
metric's history, with the same step numbers.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from slimpar.config import Config, dotted, to_dict
from slimpar.train.sinks.scalars import record_scalars, summary_scalars

STORE = "mlruns"
EXPERIMENT = "slimpar"
MAX_BATCH = 100  # MLflow's limit on params per log_batch call


def store_uri(out_dir: Path) -> str:
    """The tracking URI of a run folder's MLflow store, for ``MlflowClient(tracking_uri=...)``."""
    return (Path(out_dir).resolve() / STORE).as_uri()


def flat_params(tree: dict[str, Any]) -> dict[str, str]:
    """The config tree as ``section.key`` -> value text (lists comma-separated, as on the command line)."""
    return {key: ",".join(map(str, value)) if isinstance(value, list) else str(value)
            for key, value in dotted(tree).items()}


class MLflowSink:
    def __init__(self, out_dir: Path, cfg: Config):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=store_uri(out_dir))
        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        exp_id = experiment.experiment_id if experiment else self.client.create_experiment(EXPERIMENT)
        runs = self.client.search_runs([exp_id], order_by=["attributes.start_time DESC"], max_results=1)
        if runs:  # a resume: continue the run this folder started
            self.run_id = runs[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            run = self.client.create_run(exp_id, run_name=Path(out_dir).resolve().name,
                                         tags={"slimpar.mode": cfg.parallel.mode,
                                               "slimpar.run_folder": str(Path(out_dir).resolve())})
            self.run_id = run.info.run_id
            self._log_params(flat_params(to_dict(cfg)))

    def _log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), MAX_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + MAX_BATCH])

    def _log(self, scalars: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in scalars.items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def write(self, record: dict[str, Any]) -> None:
        """One metrics.jsonl record: every numeric field as ``train/<name>`` at its step."""
        self._log(record_scalars(record), record["step"])

    def write_summary(self, summary: dict[str, Any], step: int) -> None:
        """The run's closing numbers as ``summary/<name>`` at the last step."""
        self._log(summary_scalars(summary), step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED")
