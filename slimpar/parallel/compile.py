"""``torch.compile`` applied block by block from outside the model (torchtitan's rule), names unchanged.

Compiling each repeated block, not the whole model or a wrapper around it, gives one forward and one
backward graph per block. A block's gradients are then final, and their post-accumulate-grad hooks fire,
as soon as that block's backward ends, so SDP's bucketed holder averaging and DDP's reducer still overlap
backward; one whole-model graph hands every gradient over at the very end (measured on SDP: every bucket
launched at 0.99 of backward, against 0.22–0.26 eager). ``nn.Module.compile`` compiles the module's call in
place, so parameter names and state dicts stay as they were (``torch.compile(module)`` would put
``_orig_mod.`` into every name that DCP and SDP's holder matching rely on).

Applied after activation checkpointing (a checkpointed block compiles with its recomputation) and before
FSDP2 and SDP's holder sync, which bind to the parameters, not to the forward.

:class:`CompileWatch` counts what dynamo did during training (graph breaks, graphs compiled after the warm-up),
from ``torch._dynamo.utils.counters``, which torch has kept under these names since 2.0 (so no compat shim).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

BACKENDS = ("inductor", "aot_eager", "eager")  # inductor: generated kernels; the others check graph capture only
# blocks: every repeated block (the overlap-safe default); loss: the blocks and the loss (cross-entropy over the
# vocabulary, one fused graph); model: the whole forward and loss in one graph (no per-block gradient hooks)
SCOPES = ("blocks", "loss", "model")


def apply_compile(blocks: nn.ModuleDict, backend: str = "inductor", mode: str | None = None) -> None:
    """Compile every block of ``blocks`` in place with ``backend`` (``mode``: torch.compile's, e.g.
    ``"reduce-overhead"``, inductor's CUDA graphs, which need ``torch.compiler.cudagraph_mark_step_begin()`` before
    each step)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown compile backend {backend!r}; choose from {', '.join(BACKENDS)}")
    for block in blocks.values():
        block.compile(backend=backend, mode=mode)


def compiled_loss(loss_fn: Callable, backend: str) -> Callable:
    """``loss_fn`` compiled on its own: the fp32 upcast, log-softmax and gather over the vocabulary become one
    graph (inductor fuses them, so the fp32 logits are never written whole). Shapes are static: every step's
    batch has the same shape, and ``dynamic=False`` keeps dynamo from guessing a dynamic size after a change."""
    return torch.compile(loss_fn, backend=backend, dynamic=False)


def compiled_forward_loss(module: nn.Module, loss_fn: Callable, backend: str) -> Callable:
    """``loss_fn(module(x), y)`` as one compiled function: the whole forward and the loss in one graph (and one
    backward graph), so the gradients arrive together at the end of backward; for modes whose gradient
    communication does not overlap a block's backward (single, the virtual modes) or that split the graph
    at their own buckets (DDP's DDPOptimizer)."""

    def forward_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return loss_fn(module(x), y)

    return torch.compile(forward_loss, backend=backend, dynamic=False)


def _dynamo_totals() -> tuple[int, int, dict[str, int]]:
    from torch._dynamo.utils import counters

    breaks = dict(counters["graph_break"])
    return counters["stats"]["unique_graphs"], sum(breaks.values()), breaks


class CompileWatch:
    """Dynamo's graph breaks and compiled graphs during training: from :meth:`start`, and graphs compiled after
    :meth:`warm` (the end of the second step; a recompile there means a guard failed: a Python scalar that
    changed, a grad-mode or ``requires_grad`` change, a new shape). The counters are per process."""

    def __init__(self) -> None:
        self._start = self._warm = (0, 0, {})

    def start(self) -> None:
        self._start = self._warm = _dynamo_totals()

    def warm(self) -> None:
        self._warm = _dynamo_totals()

    def record(self) -> dict:
        graphs, breaks, reasons = _dynamo_totals()
        before = self._start[2]
        return {"graphs": graphs - self._start[0], "graphs_after_warmup": graphs - self._warm[0],
                "graph_breaks": breaks - self._start[1],
                "graph_break_reasons": {r: n - before.get(r, 0) for r, n in reasons.items() if n > before.get(r, 0)}}


def merge_watches(records: list[dict | None]) -> dict | None:
    """Every rank's :meth:`CompileWatch.record` summed (the run's graph breaks and late graphs on any rank)."""
    known = [r for r in records if r]
    if not known:
        return None
    reasons: dict[str, int] = {}
    for r in known:
        for reason, n in r["graph_break_reasons"].items():
            reasons[reason] = reasons.get(reason, 0) + n
    return {"graph_breaks": sum(r["graph_breaks"] for r in known),
            "graphs_after_warmup": sum(r["graphs_after_warmup"] for r in known),
            "graph_break_reasons": reasons}
