"""Heterogeneous memory: choose each worker's keep C_i from a memory budget (pure functions).

Predicted peak of worker i holding the components H_i (``predict_peak``)::

    peak_i = state_factor * (shared_bytes + sum_{c in H_i} b_c)      static: params + grads + optimizer
           + sum_{c in H_i} a_c                                       activations of the held blocks
           + fixed_bytes                                              shared activations, buffers, loss transients

``state_factor`` = 4 for fp32 AdamW (the parameter, its gradient and the two moments, all in the
parameter's dtype; the 0-dim ``step`` counters are not counted). b_c is the component's parameter
bytes and a_c its activation bytes.

For slimpar's LLaMA (``llama_activation_bytes``) the activation terms are analytic, derived from the
tensors autograd saves for backward in fp32 eager mode without activation checkpointing, per token of
the worker's micro-batch (t = batch / workers x seq_len tokens; d = dim, f = ffn_dim, H = heads,
V = vocab), 4 bytes per element:

- per block, a_c = 4 t (10 d + 4 f + H + 2): the block input and the attention-norm output (2 d), the
  attention norm's normalised input and 1/rms (d + 1), the RoPE'd q and the head-repeated k and v that
  SDPA saves with its output (4 d, the output reshaped for wo is a view) and log-sum-exp (H), the
  residual after attention, the FFN norm's normalised input, 1/rms and output (3 d + 1), and the SwiGLU's
  w1 output, silu output, w3 output and their product (4 f);
- fixed = 4 t (3 d + 1 + V) + 16 t + 8 + buffers + 8 t V: the final norm's input, normalised input,
  1/rms and output (3 d + 1), log-softmax's output (V), the int64 token ids of the embedding and of the
  loss target (16 t bytes), two scalars (loss and the loss's weight total, 8 bytes), the model's
  buffers (the RoPE tables, saved by every block as views of the same storage) and, at the peak (the
  start of backward, when every saved tensor is still alive), the gradients of the log-probabilities and
  of the logits (2 t V elements).

The numbers are those of ``slimpar train``'s exact accounting (``per_rank[i]["mem"]["peak_live"]``),
which counts the gradients of the previous step as static memory. The model assumes that the peak is
at the start of backward: that backward frees a block's activations faster than it allocates its
gradients (t (10 d + 4 f) > 4 d^2 + 3 d f, about t > d / 2) and that the saved activations outweigh the
new gradients and the optimizer's temporaries at the update; at tiny batches per worker it underestimates.

Keep choice (``keep_for_budgets``): worker i holds m_i = the largest number of components whose
predicted peak, with the m_i heaviest components (a bound for any placement), fits its budget;
C_i = m_i / K. Every worker needs m_i >= 1 and sum_i m_i >= min_holders K (coverage).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from torch import nn

from slimpar.sdp.components import Component, PlanError

__all__ = ["MemoryPrediction", "parse_size", "parse_budgets", "llama_activation_bytes", "model_activation_bytes",
           "predict_peak", "keep_for_budgets", "keep_by_prediction", "plan_peaks", "check_budgets", "predict_memory"]

PeakPredictor = Callable[[list[float]], list[int]]  # keeps C_0..C_{N-1} -> each worker's predicted peak (bytes)


@dataclass
class MemoryPrediction:
    """What a memory-budget plan promises each worker (``Plan.memory``): the predicted peak per worker, from
    the components it really holds, and for the analytic model (``model = "analytic"``) its inputs. With a
    predictor (``model = "predicted"``, ``keep_by_prediction``) only the peaks are the planner's; the fields
    of the analytic model are None. ``slimpar plan --json`` ("memory_budget") and summary.json
    ("sdp_memory") report ``as_dict()``."""

    budgets: list[int]  # bytes, one per worker
    tokens_per_worker: int | None  # tokens of one worker's micro-batch (analytic model)
    activation_bytes_per_block: int | None  # a_c, the same for every block (analytic model)
    fixed_bytes: int | None  # activations outside the blocks, buffers, loss transients (analytic model)
    state_factor: int | None  # bytes of state per parameter byte (4: fp32 AdamW; analytic model)
    predicted_static_bytes: list[int] | None  # params + grads + optimizer, per worker
    predicted_activation_bytes: list[int] | None  # activations of the held blocks, per worker
    predicted_peak_mem_bytes: list[int]  # the peak, per worker
    model: str = "analytic"  # "analytic" (this module's activation model) | "predicted" (a predict_peaks callable)

    def as_dict(self) -> dict:
        """JSON-ready, with the keys in field order (those of summary.json and ``slimpar plan --json``)."""
        return asdict(self)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
SYNTAX = ("a size is a number with an optional unit (B, KB, MB, GB, TB in powers of 1000; KiB, MiB, GiB, "
          "TiB in powers of 1024), e.g. 120MiB; give one size for every worker, one per worker "
          "(200MiB,120MiB,120MiB,80MiB), or classes COUNTxSIZE (2x200MiB,2x100MiB)")


def parse_size(text: str) -> int:
    """'120MiB' -> 125829120 bytes; a plain number is bytes. PlanError on bad syntax or a size <= 0."""
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise PlanError(f"memory budget {text!r}: not a size; {SYNTAX}")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise PlanError(f"memory budget {text!r} must be positive")
    return value


def parse_budgets(entries: str | Sequence[str], workers: int) -> list[int]:
    """Budgets in bytes for ``workers`` workers from one size (every worker), one size per worker, or
    classes ``COUNTxSIZE`` that expand in order (``2x200MiB,2x100MiB``); plain sizes and classes mix.
    ``entries`` is a comma-separated string or a sequence of such entries."""
    if isinstance(entries, str):
        entries = entries.split(",")
    entries = [str(e).strip() for e in entries if str(e).strip()]
    if not entries:
        raise PlanError(f"empty memory budget; {SYNTAX}")
    if len(entries) == 1 and "x" not in entries[0].lower():
        return [parse_size(entries[0])] * workers
    out: list[int] = []
    for e in entries:
        count, sep, size = e.lower().partition("x")
        if sep and count.strip().isdigit():
            if int(count) < 1:
                raise PlanError(f"memory budget class {e!r}: the count must be >= 1")
            out += [parse_size(size)] * int(count)
        else:
            out.append(parse_size(e))
    if len(out) != workers:
        raise PlanError(f"memory budget {','.join(entries)} gives {len(out)} budgets for {workers} workers; "
                        f"{SYNTAX}")
    return out


def llama_activation_bytes(tokens: int, dim: int, ffn_dim: int, n_heads: int, vocab_size: int,
                           buffer_bytes: int = 0) -> tuple[int, int]:
    """(activation bytes per block, fixed bytes) of slimpar's fp32 LLaMA for ``tokens`` tokens per
    worker per step; the derivation is in the module docstring."""
    per_block = 4 * tokens * (10 * dim + 4 * ffn_dim + n_heads + 2)
    fixed = 4 * tokens * (3 * dim + 1 + vocab_size) + 16 * tokens + 8 + buffer_bytes + 8 * tokens * vocab_size
    return per_block, fixed


def model_activation_bytes(model: nn.Module, tokens: int) -> tuple[int, int]:
    """``llama_activation_bytes`` for slimpar's LLaMA ``model`` (its ``cfg`` gives d, f, H and V; its
    buffers, the RoPE tables, count once); PlanError for any other model, which the analytic model
    does not describe."""
    m = getattr(model, "cfg", None)
    if not all(hasattr(m, k) for k in ("dim", "ffn_dim", "n_heads", "vocab_size")):
        raise PlanError(f"memory budgets predict activations of slimpar's LLaMA only (a model with cfg.dim, "
                        f"cfg.ffn_dim, cfg.n_heads, cfg.vocab_size); {type(model).__name__} is not one: give "
                        "the keeps yourself")
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return llama_activation_bytes(tokens, m.dim, m.ffn_dim, m.n_heads, m.vocab_size, buffers)


def _per_component(value: int | Sequence[int], k: int) -> list[int]:
    values = [int(value)] * k if isinstance(value, (int, float)) else [int(v) for v in value]
    if len(values) != k:
        raise PlanError(f"activation bytes given for {len(values)} components, the model has {k}")
    return values


def predict_peak(held: Sequence[Component], shared_bytes: int, activation_bytes: int | Sequence[int],
                 fixed_bytes: int = 0, state_factor: int = 4) -> dict:
    """Predicted memory of a worker holding ``held``: ``static`` (params + grads + optimizer),
    ``activations`` (of the held components), ``fixed`` and their sum ``peak``, in bytes."""
    acts = _per_component(activation_bytes, len(held))
    static = state_factor * (int(shared_bytes) + sum(c.param_bytes for c in held))
    return {"static": static, "activations": sum(acts), "fixed": int(fixed_bytes),
            "peak": static + sum(acts) + int(fixed_bytes)}


def _worst(components: Sequence[Component], acts: list[int], m: int, shared_bytes: int, fixed_bytes: int,
           state_factor: int) -> int:
    """Peak with the m components that cost most (params and activations): a bound for any placement."""
    cost = sorted((state_factor * c.param_bytes + a for c, a in zip(components, acts, strict=True)), reverse=True)
    return state_factor * int(shared_bytes) + int(fixed_bytes) + sum(cost[:m])


def keep_for_budgets(components: Sequence[Component], shared_bytes: int, budgets: Sequence[int],
                     activation_bytes_per_block: int | Sequence[int], fixed_bytes: int = 0, min_holders: int = 1,
                     state_factor: int = 4) -> list[float]:
    """C_i = m_i / K for each budget (module docstring); PlanError naming the budgets and the minimum
    that would work when a worker cannot hold one component or coverage is out of reach."""
    from slimpar.utils import fmt_bytes

    k, n = len(components), len(budgets)
    if not k:
        raise PlanError("no maskable components: nothing to plan")
    acts = _per_component(activation_bytes_per_block, k)
    peaks = [_worst(components, acts, m, shared_bytes, fixed_bytes, state_factor) for m in range(k + 1)]
    fit = [max((m for m in range(k + 1) if peaks[m] <= b), default=0) for b in budgets]
    shown = ", ".join(fmt_bytes(b) for b in budgets)
    if low := [i for i, m in enumerate(fit) if m == 0]:
        raise PlanError(f"memory budgets [{shown}]: worker(s) {low} cannot hold even one component: the shared "
                        f"parameters alone need {fmt_bytes(peaks[0])} (params + grads + optimizer + fixed "
                        f"activations) and one component {fmt_bytes(peaks[1])}; raise those budgets to at least "
                        f"{fmt_bytes(peaks[1])}")
    need = min_holders * k
    if sum(fit) < need:
        each = math.ceil(need / n)
        raise PlanError(f"memory budgets [{shown}] fit {fit} of {k} components per worker, {sum(fit)} slots in all, "
                        f"but min_holders={min_holders} needs {need}; the minimum that would work: "
                        f"{fmt_bytes(peaks[min(each, k)])} for every worker ({each} of {k} components each), or "
                        f"larger budgets for some workers until the slots reach {need}")
    return [m / k for m in fit]


def keep_by_prediction(predict_peaks: PeakPredictor, budgets: Sequence[int], steps: int,
                       min_holders: int = 1) -> tuple[list[float], list[int]]:
    """Each worker's keep C_i = m_i / ``steps`` (``steps``: the keep's grain, e.g. K blocks or the groups per
    layer) from a predictor of the peaks of the plan with given keeps: after a check that every worker fits
    with one step (else PlanError at once; where one step each covers the model), every worker starts at the
    whole model (m_i = steps); while some workers' predicted peaks exceed their budgets, each of those drops
    one step, and the plan is predicted again (a worker's peak may depend on the others' keeps through the
    placement). Returns the keeps and their predicted peaks, all within budget; PlanError when a worker
    does not fit with one step or coverage (``min_holders``) is out of reach."""
    from slimpar.utils import fmt_bytes

    n = len(budgets)
    shown = ", ".join(fmt_bytes(b) for b in budgets)
    if n >= min_holders * steps:  # one step each is a plan: check it first, a budget too small fails at once
        _check_floor([int(p) for p in predict_peaks([1 / steps] * n)], budgets, steps, shown)
    m = [steps] * n
    while True:
        keeps = [mi / steps for mi in m]
        peaks = [int(p) for p in predict_peaks(keeps)]
        over = [i for i in range(n) if peaks[i] > budgets[i]]
        if not over:
            return keeps, peaks
        _check_floor([p if m[i] == 1 else 0 for i, p in enumerate(peaks)], budgets, steps, shown)
        for i in over:
            m[i] -= 1
        if sum(m) < min_holders * steps:
            raise PlanError(f"memory budgets [{shown}] fit at most {m} of {steps} steps per worker, {sum(m)} in all, "
                            f"but min_holders={min_holders} needs {min_holders * steps}; raise some budgets (the "
                            f"predicted peaks at these keeps: {', '.join(fmt_bytes(p) for p in peaks)})")


def _check_floor(peaks: list[int], budgets: Sequence[int], steps: int, shown: str) -> None:
    """PlanError naming the workers whose peak with one step of keep (``peaks``; 0: not known) exceeds their budget."""
    from slimpar.utils import fmt_bytes

    if low := [i for i, (p, b) in enumerate(zip(peaks, budgets, strict=True)) if p > b]:
        need = max(peaks[i] for i in low)
        raise PlanError(f"memory budgets [{shown}]: worker(s) {low} cannot hold even one component: holding "
                        f"1/{steps} of the model the predicted peak is {fmt_bytes(need)}; raise those budgets "
                        f"to at least {fmt_bytes(need)}")


def plan_peaks(plan, activation_bytes_per_block: int | Sequence[int], fixed_bytes: int = 0,
               state_factor: int = 4) -> list[dict]:
    """``predict_peak`` for every worker of ``plan`` (a ``Plan``), from the components it really holds."""
    acts = _per_component(activation_bytes_per_block, len(plan.components))
    out = []
    for r in range(plan.world_size):
        cols = [c for c in range(len(plan.components)) if plan.mask[r, c]]
        out.append(predict_peak([plan.components[c] for c in cols], plan.shared_bytes, [acts[c] for c in cols],
                                fixed_bytes, state_factor))
    return out


def check_budgets(peaks: Sequence[dict], budgets: Sequence[int]) -> None:
    """PlanError if a planned worker's predicted peak exceeds its budget (a placement that gave a
    worker more than its m_i components, e.g. the random assignment)."""
    from slimpar.utils import fmt_bytes

    over = [(i, p["peak"], b) for i, (p, b) in enumerate(zip(peaks, budgets, strict=True)) if p["peak"] > b]
    if over:
        what = "; ".join(f"worker {i}: {fmt_bytes(p)} > {fmt_bytes(b)}" for i, p, b in over)
        raise PlanError(f"the plan exceeds memory budgets ({what}); use --sdp.assignment cyclic, which holds "
                        "exactly C_i K equal blocks, or raise those budgets")


def predict_memory(plan, budgets: Sequence[int], tokens_per_worker: int, activation_bytes_per_block: int,
                   fixed_bytes: int, state_factor: int = 4) -> MemoryPrediction:
    """Every worker's predicted memory under ``plan`` (a ``Plan``), checked against its budget
    (``check_budgets``: a placement may give a worker more than its m_i components)."""
    peaks = plan_peaks(plan, activation_bytes_per_block, fixed_bytes, state_factor)
    check_budgets(peaks, budgets)
    return MemoryPrediction(list(budgets), tokens_per_worker, activation_bytes_per_block, fixed_bytes, state_factor,
                            [p["static"] for p in peaks], [p["activations"] for p in peaks],
                            [p["peak"] for p in peaks])
