"""Averaging gradients over a data-parallel group in buckets, the way DDP's reducer bounds its buffers.

Used where torch's DDP cannot wrap the module: a pipeline stage's replicas average once after the
schedule has run every microbatch's backward (DDP would all-reduce after each one, or need its
``no_sync`` context around a schedule that owns the backward calls).

Communication: one all-reduce (sum) per bucket in ``group``, then a division by the group's size.
A bucket is a run of consecutive gradients of at most ``cap_bytes`` together, concatenated into one
flat buffer; a gradient larger than the cap is its own bucket and is reduced in place. The transient
memory is therefore at most one bucket, not a second copy of every gradient.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

BUCKET_BYTES = 25 * 2**20  # torch DDP's default ``bucket_cap_mb``


def buckets(grads: Sequence[torch.Tensor], cap_bytes: int = BUCKET_BYTES) -> Iterator[list[torch.Tensor]]:
    """Consecutive runs of ``grads`` of at most ``cap_bytes`` each; one larger than the cap stands alone."""
    run: list[torch.Tensor] = []
    size = 0
    for g in grads:
        n = g.numel() * g.element_size()
        if run and size + n > cap_bytes:
            yield run
            run, size = [], 0
        run.append(g)
        size += n
    if run:
        yield run


def average_grads(grads: Sequence[torch.Tensor], group: dist.ProcessGroup, cap_bytes: int = BUCKET_BYTES) -> None:
    """Replace each of ``grads`` by its mean over the ranks of ``group``, in place, bucket by bucket."""
    size = dist.get_world_size(group)
    for run in buckets(grads, cap_bytes):
        if len(run) == 1 and run[0].is_contiguous():
            dist.all_reduce(run[0], group=group)
            run[0].div_(size)
            continue
        flat = torch.cat([g.reshape(-1) for g in run])
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        offset = 0
        for g in run:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
