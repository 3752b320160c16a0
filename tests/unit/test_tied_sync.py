"""The tied embedding/head exchange (pipeline/sync.py ``tied_sync``) against a hand computation.

Stage 0 (sender) holds the embedding, whose gradient lives on the step's distinct ids only; stage P − 1
(receiver) holds the dense head. Both ends must get head part + embedding part, exactly (fp32) and bit
for bit the same, with u·d·4 bytes one way and V·d·4 the other, counted as kind ``tied``.
"""

from __future__ import annotations

import torch
from torch import nn

from slimpar.pipeline.sync import SENDER_ROWS, run_phases, tied_sync
from slimpar.pipeline.wire import ByteCounter, LocalLink

V, D = 50, 8


def test_both_ends_get_head_plus_embedding_rows() -> None:
    g = torch.Generator().manual_seed(0)
    rows = torch.tensor([1, 4, 7, 30])
    emb, head = nn.Parameter(torch.zeros(V, D)), nn.Parameter(torch.zeros(V, D))
    emb.grad = torch.zeros(V, D)
    emb.grad[rows] = torch.randn(len(rows), D, generator=g)  # an embedding's gradient: zero off the ids
    head.grad = torch.randn(V, D, generator=g)
    exact = emb.grad + head.grad
    counter = ByteCounter()
    counter.begin_step()
    first, last = LocalLink.pair(3, counter)
    ends = [tied_sync([("tied.weight", emb, SENDER_ROWS)], "sender", first),
            tied_sync([("tied.weight", head, SENDER_ROWS)], "receiver", last)]
    run_phases(ends, "post", "finish", rows=rows)
    assert torch.equal(emb.grad, head.grad) and torch.equal(emb.grad, exact)
    assert dict(counter.step) == {(3, "fwd", "tied"): len(rows) * D * 4, (3, "bwd", "tied"): V * D * 4}
