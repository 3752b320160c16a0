"""Memory: per-rank accounting of a running step (``accounting``), the prediction of a run's peak under
FakeTensorMode (``predict``, ``predict_pipeline``, ``stand_ins``), and per-worker budgets (``budget``,
``budget_record``). Inside ``train`` because the prediction runs the run's own step (``slimpar.train.step``); it
never imports the trainer or the launcher."""

__all__ = ["accounting", "budget", "budget_record", "floor_check", "measured", "predict", "predict_pipeline",
           "stand_ins"]
