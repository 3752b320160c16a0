"""Validation: loss, perplexity and bits per byte for text; accuracy for images.

Bits per byte = Σ nll (nats) / ln 2 / Σ UTF-8 bytes of the predicted tokens, so runs with
different tokenizers compare. Ranks evaluate disjoint shares of the batches where the strategy
allows it (one all-reduce of six numbers per split: three per half), otherwise all ranks run every batch.
The sums live on the model's device (batches add without a host sync, and NCCL reduces CUDA tensors
only); target bytes are read from the host batch; one copy to the host per split.
Text splits also report the loss on each half of their batches (``val_loss_half1``, ``val_loss_half2``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from slimpar.pipeline.evaluate import half, split_metrics


@torch.no_grad()
def evaluate(strategy, data, cfg, rank: int, world: int, group=None) -> dict[str, float]:
    module = strategy.eval_module()
    was_training = module.training
    module.eval()
    results: dict[str, float] = {}
    try:
        for split, batches in val_splits(data, cfg).items():
            results.update(_eval_split(module, split, batches, data, cfg, rank, world, group,
                                       sharded=strategy.eval_sharded))
    finally:
        module.train(was_training)
    return results


def val_splits(data, cfg) -> dict[str, list]:
    """Split name -> its validation batches, as ``[eval]`` asks (every rank builds the same ones)."""
    e = cfg.eval
    if cfg.data.kind == "text":
        return {s: data.val_batches(s, e.batch_size, e.batches, cfg.data.seq_len) for s in data.val_streams}
    return data.val_batches(e.batch_size, e.batches)


def _eval_split(module, split, batches, data, cfg, rank, world, group, sharded) -> dict[str, float]:
    text = cfg.data.kind == "text"
    device = next(module.parameters()).device
    sums = torch.zeros(2, 3, dtype=torch.float64, device=device)  # per half: nll, count, bytes (text) / correct
    for i, (x, y) in enumerate(batches):  # y stays on the host for its byte count
        if sharded and world > 1 and i % world != rank:
            continue
        logits = module(x.to(device))
        target, h = y.to(device), half(i, len(batches))
        if text:
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), reduction="sum")
            sums[h, 2] += float(data.target_bytes(y) or 0)
        else:
            nll = F.cross_entropy(logits.float(), target, reduction="sum")
            sums[h, 2] += (logits.argmax(-1) == target).sum()  # correct predictions
        sums[h, 0] += nll.double()
        sums[h, 1] += y.numel()
    if sharded and world > 1:
        dist.all_reduce(sums, group=group)
    sums = sums.cpu()
    if text:
        return split_metrics(split, sums)
    nll, count, correct = sums.sum(0).tolist()
    prefix = "val" if split in ("heldout", "test") else f"val_{split}"
    return {f"{prefix}_loss": nll / max(count, 1), f"{prefix}_accuracy": correct / max(count, 1)}
