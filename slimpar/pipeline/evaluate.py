"""Validation through the pipeline: the same stages and codecs as training, so compression is measured.

Each validation batch (the whole batch is one microbatch) runs forward through the stages this process
holds: stage s decodes the message of boundary s − 1, runs its blocks, and its encoder's message goes
to stage s + 1 (on a P2P link with the evaluation tag, or a local link in the virtual pipeline). The
codec halves are in eval mode: RVQ codebooks do not move, so no codebook message is needed and the
receiver decodes with the version it holds. Token ids are read locally (every rank builds the same
validation batches); evaluation traffic is not added to the training byte counts.

The caller passes the validation batches of each split (the trainer builds them from its config).
Data-parallel replicas evaluate disjoint shares of the batches; the last stage's sums of nll, tokens
and target bytes are all-reduced over every rank (other ranks add zeros). Keys match
slimpar.train.evaluate: ``val_loss``, ``val_perplexity``, ``val_bits_per_byte``, ``val_<split>_*``, and the
loss on each half of a split's batches (``val_loss_half1``, ``val_loss_half2``: the noise floor).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from slimpar.pipeline.split import StageModule
from slimpar.pipeline.wire import TAG_EVAL, ByteCounter, Link, recv_message, send_message, wait_all


def forward_batch(stages: list[StageModule], links_in: dict[int, Link], links_out: dict[int, Link],
                  x: torch.Tensor) -> torch.Tensor | None:
    """Run the held stages (in order) on one batch; logits if the last stage is held, else None."""
    shape, out = tuple(x.shape), None
    for stage in stages:
        stage.context.set_batch(x, 1)
        stage.context.microbatch = 0
        inp = x
        if stage.decoder is not None:
            fixed, extra = recv_message(links_in[stage.stage - 1], stage.decoder, shape, TAG_EVAL, TAG_EVAL)
            inp = stage.decoder.decode(fixed, extra, shape)
        out = stage(inp)
        if stage.encoder is not None:
            wait_all(send_message(links_out[stage.stage], stage.encoder.outbox.pop(0), TAG_EVAL, TAG_EVAL))
            out = None
    return out


@torch.no_grad()
def evaluate_pipeline(stages: list[StageModule], links_in: dict[int, Link], links_out: dict[int, Link],
                      counter: ByteCounter, splits: Mapping[str, Sequence[tuple[torch.Tensor, torch.Tensor]]],
                      target_bytes: Callable[[torch.Tensor], int | None], replica: int = 0, replicas: int = 1,
                      reduce: Callable[[torch.Tensor], None] | None = None) -> dict[str, float]:
    """Validation metrics through ``stages``.

    ``splits``: split name -> its (x, y) token batches, (b, T) each, the same on every rank;
    ``target_bytes(y)``: UTF-8 bytes of the target tokens (None: unknown, so no bits per byte);
    ``reduce`` sums a float64 tensor over ranks (None: local).
    """
    modes = [s.training for s in stages]
    for s in stages:
        s.eval()
    counter.enabled = False
    results: dict[str, float] = {}
    try:
        for split, batches in splits.items():
            sums = torch.zeros(2, 3, dtype=torch.float64)  # per half: nll (nats), tokens, target bytes
            for i, (x, y) in enumerate(batches):
                if i % replicas != replica:
                    continue
                device = next(stages[0].parameters()).device
                logits = forward_batch(stages, links_in, links_out, x.to(device))
                if logits is not None:  # y stays on the host for its byte count
                    target = y.to(device).reshape(-1)
                    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target, reduction="sum")
                    sums[half(i, len(batches))] += torch.tensor([float(nll), y.numel(), float(target_bytes(y) or 0)],
                                                                dtype=torch.float64)
            if reduce is not None:
                reduce(sums)
            results.update(split_metrics(split, sums))
    finally:
        counter.enabled = True
        for s, mode in zip(stages, modes, strict=True):
            s.train(mode)
    return results


def half(i: int, n: int) -> int:
    """0 for the first ceil(n / 2) of ``n`` validation batches, 1 for the rest: two disjoint halves of a split."""
    return int(i >= (n + 1) // 2)


def split_metrics(split: str, sums: torch.Tensor) -> dict[str, float]:
    """Text metrics of a split from its per-half sums (2, 3): nll (nats), tokens, target bytes.

    ``*_tokens`` is how many target tokens were scored; ``*_loss_half1`` / ``*_loss_half2`` are the same
    model's loss on the two disjoint halves of the split's batches: their
    difference is the evaluation's noise floor (an effect smaller than it cannot be resolved)."""
    nll, count, nbytes = sums.sum(0).tolist()
    loss = nll / max(count, 1)
    prefix = "val" if split in ("heldout", "test") else f"val_{split}"
    out = {f"{prefix}_loss": loss, f"{prefix}_perplexity": math.exp(min(loss, 50.0)),
           f"{prefix}_bits_per_byte": nll / math.log(2) / nbytes if nbytes else float("nan"),
           f"{prefix}_tokens": count}
    for h, (h_nll, h_count, _) in enumerate(sums.tolist()):
        if h_count:
            out[f"{prefix}_loss_half{h + 1}"] = h_nll / h_count
    return out


def all_reduce_sum(group: dist.ProcessGroup, device: torch.device | str = "cpu") -> Callable[[torch.Tensor], None]:
    """In-place sum over ``group`` of a host tensor (through ``device``: NCCL reduces device tensors only)."""

    def reduce(t: torch.Tensor) -> None:
        buf = t.to(device)
        dist.all_reduce(buf, group=group)
        t.copy_(buf.cpu())

    return reduce
