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
"""

from __future__ import annotations

from torch import nn

BACKENDS = ("inductor", "aot_eager", "eager")  # inductor: generated kernels; the others check graph capture only


def apply_compile(blocks: nn.ModuleDict, backend: str = "inductor") -> None:
    """Compile every block of ``blocks`` in place with ``backend``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown compile backend {backend!r}; choose from {', '.join(BACKENDS)}")
    for block in blocks.values():
        block.compile(backend=backend)
