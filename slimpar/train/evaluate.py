"""Validation: loss, perplexity and bits per byte for text; accuracy for images.

Bits per byte = Σ nll (nats) / ln 2 / Σ UTF-8 bytes of the predicted tokens, so runs with
different tokenizers compare. Ranks evaluate disjoint shares of the batches where the strategy
allows it (one all-reduce of three numbers per split), otherwise all ranks run every batch.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F


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
    nll = count = nbytes = 0.0
    device = next(module.parameters()).device
    for i, (x, y) in enumerate(batches):
        if sharded and world > 1 and i % world != rank:
            continue
        logits = module(x.to(device))
        y = y.to(device)
        if text:
            losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), reduction="none")
            nll += float(losses.sum())
            count += y.numel()
            nbytes += float(data.target_bytes(y.cpu()) or 0)
        else:
            nll += float(F.cross_entropy(logits.float(), y, reduction="sum"))
            nbytes += float((logits.argmax(-1) == y).sum())  # correct predictions
            count += y.numel()
    if sharded and world > 1:
        t = torch.tensor([nll, count, nbytes], dtype=torch.float64)
        dist.all_reduce(t, group=group)
        nll, count, nbytes = t.tolist()
    loss = nll / max(count, 1)
    prefix = "val" if split in ("heldout", "test") else f"val_{split}"
    if not text:
        return {f"{prefix}_loss": loss, f"{prefix}_accuracy": nbytes / max(count, 1)}
    out = {f"{prefix}_loss": loss, f"{prefix}_perplexity": math.exp(min(loss, 50.0))}
    out[f"{prefix}_bits_per_byte"] = nll / math.log(2) / nbytes if nbytes else float("nan")
    return out
