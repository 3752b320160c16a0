"""``sdp.memory_budget`` for any model: each worker's keep C_i chosen against the FakeTensorMode prediction of
the run's own step (slimpar.train.memory.predict), not the analytic LLaMA model (slimpar.sdp.budget).

Where: in the process that launches the run, before any process group exists (the prediction joins a fake
one of its own; under torchrun every rank resolves the same keeps before it joins the job's group, the
prediction being a pure function of the config). It runs once there, not in every worker, and a budget that
cannot be met stops the run with exit 2 before anything is written or started. The workers get the chosen
keeps as ``sdp.keep_per_worker`` of the config they run; the run folder's ``config.toml`` keeps what was
asked (the budget), and its ``memory_budget.json`` (memory_budget_record.py) what was chosen and predicted,
which the summary reports next to the measured peaks.

The search is ``slimpar.sdp.budget.keep_by_prediction``: start from the whole model, lower the keep of the
workers over budget one step at a time, predict again; each prediction costs a build and
``log.measure_step + 1`` fake steps per rank.
"""

from __future__ import annotations

from dataclasses import replace

from slimpar.config import Config, ConfigError
from slimpar.sdp.components import PlanError
from slimpar.train.modes import mode_of


class BudgetPredictor:
    """``predict_peaks(keeps)`` for the planner: worker w's predicted peak is the largest ``peak_live`` of its
    ``sdp.fsdp`` ranks, predicted for the run with ``sdp.keep_per_worker = keeps``. Remembers each call's
    per-rank records (the last call's keeps are the chosen ones)."""

    def __init__(self, cfg: Config):
        self.cfg = replace(cfg, sdp=replace(cfg.sdp, memory_budget=""))
        self.calls: list[tuple[list[float], list[dict]]] = []

    def __call__(self, keeps: list[float]) -> list[int]:
        from slimpar.train.memory.predict import predict_memory

        cfg = replace(self.cfg, sdp=replace(self.cfg.sdp, keep_per_worker=list(keeps)))
        records = predict_memory(cfg)
        self.calls.append((list(keeps), records))
        f = cfg.sdp.fsdp
        return [max(r["peak_live"] for r in records[w * f:(w + 1) * f]) for w in range(len(keeps))]


def choose_keeps(cfg: Config, workers: int | None = None):
    """(plan, predictor) of ``cfg``'s budgets: the plan whose keeps the prediction fits (``plan.memory``)."""
    from slimpar.train.run_plan import run_plan
    from slimpar.train.strategies.sdp_plan import plan_from_config

    predictor = BudgetPredictor(cfg)  # each keep it tries is predicted with a plan of its own
    try:
        plan = plan_from_config(cfg, run_plan(cfg).meta_model, workers, predict_peaks=predictor)
    except PlanError as e:
        raise ConfigError(f"sdp.memory_budget: {e}") from None
    return plan, predictor


def resolve_memory_budget(cfg: Config) -> tuple[Config, dict | None]:
    """The config the workers run (``sdp.keep_per_worker`` = the chosen keeps) and the record for
    the run folder's ``memory_budget.json``; ``cfg`` itself and None without a memory budget (or outside SDP)."""
    if not mode_of(cfg).memory_budget(cfg):
        return cfg, None
    plan, predictor = choose_keeps(cfg)
    keeps, records = predictor.calls[-1]
    f = cfg.sdp.fsdp
    worst = [max(records[w * f:(w + 1) * f], key=lambda r: r["peak_live"]) for w in range(len(keeps))]
    memory = replace(plan.memory, predicted_static_bytes=[r["params"] + r["grads"] + r["optimizer"] for r in worst],
                     predicted_activation_bytes=[r["activations"] for r in worst])
    record = {**memory.as_dict(), "keeps": keeps, "predicted_per_rank": records,
              "searched": [c[0] for c in predictor.calls]}
    return replace(cfg, sdp=replace(cfg.sdp, keep_per_worker=keeps)), record
