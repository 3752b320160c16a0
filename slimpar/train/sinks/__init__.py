"""Where a run's numbers go: ``metrics.jsonl``, ``summary.json`` and the closing table (``metrics``), and the
optional trackers (``trackers``: TensorBoard, MLflow). Knows nothing of the strategies, the trainer or the launcher."""

__all__ = ["metrics", "mlflow_sink", "progress", "scalars", "tensorboard", "trackers"]
