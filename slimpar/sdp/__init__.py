"""Subnetwork Data Parallelism: plan (pure), apply (build a worker's subnetwork), sync (holder groups, on any
process group); VirtualSDP runs every worker in one process through the same sync code, BatchedSDP every
worker on one model copy in one batched pass (equal to rounding)."""

from slimpar.sdp.apply import apply_subnet, meta_skeleton
from slimpar.sdp.batched import BatchedSDP
from slimpar.sdp.budget import MemoryPrediction, keep_for_budgets, parse_budgets, predict_peak
from slimpar.sdp.components import Component, PlanError, model_components
from slimpar.sdp.holders import HolderSync
from slimpar.sdp.plan import Plan, analytic_bytes_per_step, plan_components
from slimpar.sdp.planner import plan_blocks, plan_model, plan_neurons
from slimpar.sdp.virtual import VirtualSDP

__all__ = ["BatchedSDP", "Component", "HolderSync", "MemoryPrediction", "Plan", "PlanError", "analytic_bytes_per_step",
           "apply_subnet", "keep_for_budgets", "meta_skeleton", "model_components", "parse_budgets", "predict_peak",
           "plan_blocks", "plan_components", "plan_model", "plan_neurons", "VirtualSDP"]
