"""Subnetwork Data Parallelism: plan (pure), apply (build a worker's subnetwork), sync (holder groups);
VirtualSDP simulates all workers in one process."""

from slimpar.sdp.budget import MemoryPrediction, keep_for_budgets, parse_budgets, predict_peak
from slimpar.sdp.components import Component, PlanError, model_components
from slimpar.sdp.plan import Plan, analytic_bytes_per_step, plan_components
from slimpar.sdp.planner import plan_blocks, plan_model, plan_neurons
from slimpar.sdp.virtual import VirtualSDP

__all__ = ["Component", "MemoryPrediction", "Plan", "PlanError", "analytic_bytes_per_step", "keep_for_budgets",
           "model_components", "parse_budgets", "predict_peak", "plan_blocks", "plan_components", "plan_model",
           "plan_neurons", "VirtualSDP"]
