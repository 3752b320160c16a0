"""A dropped ``GradSync`` (SDP's bucketed holder all-reduce) is freed at once and takes its hooks with it.

Its hooks sit on the parameters, where autograd holds them from C++, out of sight of Python's cycle collector: a
hook that held the GradSync kept it, its buckets and its process groups alive until interpreter exit, where a
gloo group being destroyed can abort a finished process (SIGABRT). Before the fix the first check below failed:
the GradSync outlived ``del`` and ``gc.collect()``."""

import gc
import weakref

import torch
from torch import nn

from slimpar.sdp.sync import GradSync, Piece, make_buckets


class _Comm:
    """Records the holder sets it is asked to all-reduce; the work is done at once."""

    def __init__(self, calls: list):
        self.calls = calls

    def all_reduce(self, key, bufs, async_op=False):
        self.calls.append(tuple(key))
        return self

    def wait(self) -> None:
        pass


def test_a_dropped_grad_sync_is_freed_and_leaves_no_hook():
    p, calls = nn.Parameter(torch.ones(3)), []
    sync = GradSync(make_buckets({0: {(0, 1): [Piece(p, "p")]}}, 1 << 20), _Comm(calls))
    (2 * p).sum().backward()
    assert calls == [(0, 1)]  # alive, its hook launched the bucket once the gradient was final
    sync.finish()
    torch.testing.assert_close(p.grad, torch.ones(3))  # the sum over the holder set (here 2 * p's gradient) / 2

    ref = weakref.ref(sync)
    del sync
    gc.collect()
    assert ref() is None
    assert not p._post_accumulate_grad_hooks
    p.grad = None
    (2 * p).sum().backward()  # the parameter trains on alone: no hook, no launch
    assert calls == [(0, 1)]
    torch.testing.assert_close(p.grad, torch.full((3,), 2.0))
