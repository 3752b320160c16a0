"""Activation checkpointing applied from outside the model, keeping parameter names unchanged.

Each block's ``forward`` is replaced on the instance by one that runs the original forward under
``torch.utils.checkpoint.checkpoint(use_reentrant=False)``: only the block input is saved, the
rest is recomputed in backward. Wrapping the module in a ``CheckpointWrapper`` would insert a
``_checkpoint_wrapped_module`` level into every parameter name, which breaks the stable names that
SDP holder matching and DCP rely on; patching the instance keeps them.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint


def apply_ac(blocks: nn.ModuleDict) -> None:
    """Checkpoint every block in ``blocks`` (in place)."""
    for block in blocks.values():
        if getattr(block, "_slimpar_ac", False):
            continue
        original = block.forward

        @functools.wraps(original)
        def forward(*args, _f=original, **kwargs):
            return checkpoint(_f, *args, use_reentrant=False, **kwargs)

        block.forward = forward
        block._slimpar_ac = True


def model_blocks(model: nn.Module) -> nn.ModuleDict:
    """The repeated blocks of a slimpar model: ``layers`` (LLaMA) or ``blocks`` (ResNet, Swin)."""
    for name in ("layers", "blocks"):
        blocks = getattr(model, name, None)
        if isinstance(blocks, nn.ModuleDict):
            return blocks
    raise TypeError(f"{type(model).__name__} has no ModuleDict of blocks named 'layers' or 'blocks'")
