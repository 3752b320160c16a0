"""``slimpar.parallel.average``: the pipeline replicas' bucketed gradient average, on 3 gloo ranks.

Every rank rebuilds all ranks' gradients from their seeds, so the reference mean is computed locally
(torch.stack(...).mean) and independently of any collective. Checked: each gradient becomes that mean in
place (the same tensor object, a transposed one included), and no all-reduce carries more than one bucket
(the cap) unless a single gradient is larger than the cap, which is then reduced in place.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from slimpar.parallel import average
from slimpar.parallel.average import average_grads, buckets
from tests.helpers import spawn_gloo

SHAPES = [(7,), (3, 5), (40,), (2, 2), (64,), (5, 3)]  # fp32: 28, 60, 160, 16, 256, 60 bytes
CAP = 100  # bytes: buckets [28 60] [160] [16] [256] [60]; 160 and 256 exceed it and stand alone


def _grads(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    out = [torch.randn(s, generator=g) for s in SHAPES]
    out[-1] = torch.randn(3, 5, generator=g).t()  # non-contiguous: reduced through the flat copy
    return out


def test_buckets_close_before_the_cap_and_keep_large_tensors_alone():
    sizes = [[t.numel() * 4 for t in run] for run in buckets(_grads(0), CAP)]
    assert sizes == [[28, 60], [160], [16], [256], [60]]
    assert [len(run) for run in buckets(_grads(0), 10**9)] == [len(SHAPES)]


def _worker(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=3)
    seen: list[tuple[int, bool]] = []
    real = dist.all_reduce

    def counting(t, group=None):
        seen.append((t.numel() * t.element_size(), any(t is g for g in grads)))
        return real(t, group=group)

    grads = _grads(rank)
    ids = [id(g) for g in grads]
    average.dist.all_reduce = counting
    average_grads(grads, dist.group.WORLD, cap_bytes=CAP)
    want = [torch.stack([_grads(r)[i] for r in range(3)]).mean(0) for i in range(len(SHAPES))]
    errors = [float((g - w).abs().max()) for g, w in zip(grads, want, strict=True)]
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"errors": errors, "same_objects": ids == [id(g) for g in grads], "seen": seen}, f)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_each_gradient_becomes_the_mean_in_place_one_bucket_at_a_time(tmp_path):
    for text in spawn_gloo(_worker, 3, tmp_path):
        got = json.loads(text)
        assert max(got["errors"]) < 1e-6, got["errors"]
        assert got["same_objects"]
        # (bytes, reduced in place): two flat buckets under the cap, the two large gradients in place
        assert got["seen"] == [[88, False], [160, True], [16, True], [256, True], [60, False]]
