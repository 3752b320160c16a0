"""Which of torch's AdamW implementations a set of parameters can use."""

from __future__ import annotations

import torch


def adamw_kernels(params: list[torch.Tensor]) -> dict:
    """torch's fused AdamW (one kernel over all parameters, step counters kept on their device: no host read per
    parameter) where every parameter is a plain tensor on one device type; foreach where all are FSDP2's DTensor
    shards, which still groups the tensors (torch's default on a CPU is a Python loop per parameter); the loop
    where the two kinds mix."""
    sharded = [hasattr(p, "to_local") for p in params]
    if not any(sharded) and len({p.device.type for p in params}) <= 1:
        return {"fused": True}
    # foreach needs one kind of tensor: holder-sharded FSDP2 leaves a block with one holder a plain tensor
    return {"foreach": all(sharded)}
