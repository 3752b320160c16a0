"""Plans from a model: the one path that ``plan_blocks``, ``plan_neurons`` and ``slimpar train`` /
``slimpar plan`` (through ``slimpar.train.strategies.sdp_plan.plan_from_config``) all take, so a library
user and the CLI get the same mask for the same settings.

``plan_model`` extracts the components (``model_components``), then, in order:

- memory budgets (optional): each worker's keep C_i is the most that fits its budget, under a peak
  predictor the caller gives (``predict_peaks``: any model; ``slimpar train`` passes the FakeTensorMode
  prediction of the run's own step) or else the analytic activation model (``slimpar.sdp.budget``;
  slimpar's fp32 LLaMA only), and the finished plan carries each worker's predicted peak
  (``Plan.memory``), checked against its budget;
- neuron level without an explicit mask: the per-layer rule. Every worker keeps a fraction C_i of
  *each* layer's unit groups (cyclic or random within the layer, layer i seeded with
  ``seed * 1009 + i``). One placement over all groups in model order would instead give a worker
  whole layers' FFNs and nothing of the others, i.e. block-level SDP at a finer grain;
- neuron level on a convnet: every worker must hold a channel group of every block, since a
  convolution with no channels cannot run;
- ``plan_components`` places (or validates) the mask.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import nn

from slimpar.sdp import budget
from slimpar.sdp.components import Component, Level, PlanError, model_components
from slimpar.sdp.plan import Plan, plan_components

__all__ = ["plan_model", "plan_blocks", "plan_neurons"]

Keep = float | Sequence[float] | None


def plan_model(model: nn.Module, world_size: int, keep: Keep = None, *, level: Level = "block", groups: int = 4,
               assignment: str = "cyclic", seed: int = 0, min_holders: int = 1, mask: np.ndarray | None = None,
               balance: str = "bytes", holder_sets: int | None = None, blocks: str | None = None,
               input_shape: tuple[int, ...] | None = None, memory_budget: str | Sequence[str] | None = None,
               tokens_per_worker: int | None = None, predict_peaks: budget.PeakPredictor | None = None) -> Plan:
    """SDP plan of ``model`` for ``world_size`` workers (module docstring for the steps).

    ``keep``: C or one C_i per worker (unused with ``mask`` or ``memory_budget``). ``groups``: unit
    groups per layer at neuron level. ``blocks``: dotted path of the repeated blocks of a model that is
    not slimpar's. ``input_shape``: one input's shape, for convnets' per-image FLOPs. ``memory_budget``:
    sizes as ``slimpar.sdp.budget.parse_budgets`` reads them, with ``tokens_per_worker`` the tokens of one
    worker's micro-batch (analytic model), or ``predict_peaks(keeps) -> peaks`` the predictor to choose the
    keeps against (``budget.keep_by_prediction``; the keep's grain: ``groups`` at neuron level, one block at
    block level). ``holder_sets`` (random, block level) bounds the distinct holder sets."""
    kw = {"input_shape": input_shape} if input_shape is not None else {}
    comps, shared, shared_bytes = model_components(model, level, groups, blocks, **kw)
    activations = memory = None
    if memory_budget and predict_peaks is not None:
        budgets = budget.parse_budgets(memory_budget, world_size)
        steps = groups if level == "neuron" else len(comps)
        keep, peaks = budget.keep_by_prediction(predict_peaks, budgets, steps, min_holders)
        memory = budget.MemoryPrediction(budgets, tokens_per_worker, None, None, None, None, None, peaks, "predicted")
    elif memory_budget:
        if tokens_per_worker is None:
            raise PlanError("memory_budget needs tokens_per_worker (tokens of one worker's micro-batch)")
        budgets = budget.parse_budgets(memory_budget, world_size)
        per_block, fixed = budget.model_activation_bytes(model, tokens_per_worker)
        keep = budget.keep_for_budgets(comps, shared_bytes, budgets, per_block, fixed, min_holders)
        activations = (budgets, per_block, fixed)
    rule = assignment
    if level == "neuron" and mask is None:
        if holder_sets is not None:
            raise PlanError("holder_sets bounds one placement over all components; neuron-level plans place each "
                            "layer on its own (every worker keeps a fraction of every layer)")
        mask, assignment = _per_layer_mask(comps, world_size, keep, min_holders, rule, seed, balance), "explicit"
    if level == "neuron" and _slices_convs(model, comps):
        _check_every_layer_held(comps, mask, world_size)
    params = dict(model.named_parameters())
    plan = plan_components(comps, shared_bytes, world_size, keep, min_holders=min_holders, assignment=assignment,
                           seed=seed, mask=mask, balance=balance, shared_params=shared,
                           shared_numel=sum(params[k].numel() for k in shared), holder_sets=holder_sets)
    if assignment != rule:
        plan.assignment = f"{rule} per layer"
        plan.keep_asked = tuple(float(c) for c in np.broadcast_to(keep, world_size))  # validated per layer
    if activations is not None:
        budgets, per_block, fixed = activations
        plan.memory = budget.predict_memory(plan, budgets, tokens_per_worker, per_block, fixed)
    if memory is not None:
        plan.memory = memory
    if memory_budget:
        plan.keep_asked = None  # the budgets were asked, not a keep: C_i = m_i / K holds whole blocks anyway
    return plan


def plan_blocks(model: nn.Module, world_size: int, keep: Keep, assignment: str = "cyclic", seed: int = 0,
                min_holders: int = 1, **kw) -> Plan:
    """B-SDP plan: one component per maskable block (``model.layers``, ``model.blocks``, a HF causal LM's
    ``model.model.layers``, or any ``nn.ModuleList``/``ModuleDict`` named by ``blocks="path.to.blocks"``).
    Further keywords (``mask``, ``balance``, ``memory_budget``, ...) as for ``plan_model``."""
    return plan_model(model, world_size, keep, level="block", assignment=assignment, seed=seed,
                      min_holders=min_holders, **kw)


def plan_neurons(model: nn.Module, world_size: int, keep: Keep, groups: int = 4, assignment: str = "cyclic",
                 seed: int = 0, min_holders: int = 1, **kw) -> Plan:
    """N-SDP plan: ``groups`` hidden-unit groups per SwiGLU FFN (slimpar's LLaMA; HF LLaMA, Mistral and Qwen2's
    gate/up/down projections, with ``blocks="model.layers"``) or inner-channel groups (ResNet); every
    worker keeps a fraction ``keep`` of each layer's groups. Further keywords as for ``plan_model``."""
    return plan_model(model, world_size, keep, level="neuron", groups=groups, assignment=assignment, seed=seed,
                      min_holders=min_holders, **kw)


def _layers(comps: list[Component]) -> dict[str, list[int]]:
    """Component indices by layer, in model order."""
    layers: dict[str, list[int]] = {}
    for c, comp in enumerate(comps):
        layers.setdefault(comp.layer, []).append(c)
    return layers


def _per_layer_mask(comps: list[Component], n: int, keep: Keep, min_holders: int, assignment: str, seed: int,
                    balance: str) -> np.ndarray:
    """(n, K) mask of the per-layer rule: each layer's groups placed as a plan of their own."""
    mask = np.zeros((n, len(comps)), dtype=np.uint8)
    for i, cols in enumerate(_layers(comps).values()):
        sub = plan_components([comps[c] for c in cols], 0, n, keep, min_holders=min_holders,
                              assignment=assignment, seed=seed * 1009 + i, balance=balance)
        mask[:, cols] = sub.mask
    return mask


def _slices_convs(model: nn.Module, comps: list[Component]) -> bool:
    """Whether the components' layers hold convolutions (ResNet BasicBlocks), whose channels they slice."""
    return any(isinstance(m, nn.Conv2d) for layer in _layers(comps) for m in model.get_submodule(layer).modules())


def _check_every_layer_held(comps: list[Component], mask: np.ndarray, n: int) -> None:
    """A convolution with no channels cannot run: every worker must hold a group of every block."""
    mask = np.asarray(mask)
    for layer, cols in _layers(comps).items():
        for w in range(n):
            if not mask[w, cols].any():
                raise PlanError(f"worker {w} holds no channel group of {layer}; at channel level every worker "
                                "must hold at least one group of every block (a conv with 0 channels cannot run)")
