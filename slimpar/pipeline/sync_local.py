"""Both ends of every shared-parameter exchange in one process (the virtual pipeline): the gradients and the bytes
of ``run_phases(ends, "post", "finish")``, with the parts of every dense parameter of one shape as one batch.

For every pair (sender end, receiver end) of ``SharedParamSync`` and every parameter they still exchange, each
end's gradient part takes its wire form (``encode_part``) and back (``decode_part``), and both copies get
dec(sender's part) + dec(receiver's part), in that order: the bits ``finish`` installs. Nothing moves through the
links, since both ends are here; each end's packets are counted on its own link, as ``post`` counts them. The
dense parts of one shape and wire format (MAPL's A at every boundary, both ends) are stacked and encoded, decoded
and summed together: int8 scales per row, and bf16 / fp32 casts per element, so a part in a stack is encoded as
it is alone. Row-sparse parts (symmetric anchor tables, a tied embedding and head) go one parameter at a time.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from slimpar.pipeline.sync import SharedParamSync, decode_part, encode_part, grad_or_zeros, install_sum, rows_part
from slimpar.pipeline.wire import Packet

Pair = tuple[SharedParamSync, SharedParamSync]


def exchange_local(pairs: list[Pair], rows: Tensor) -> None:
    """The step's gradient exchange of every pair; ``rows``: the step's distinct token ids."""
    stacks: dict[tuple, list[tuple[Pair, nn.Parameter, nn.Parameter]]] = {}
    for pair in pairs:
        sender, receiver = pair
        for (_, p_s, sparse), (_, p_r, _) in zip(sender._active(), receiver._active(), strict=True):
            if sparse:
                _exchange_one(pair, p_s, p_r, sparse, rows)
            else:
                key = (tuple(p_s.shape), p_s.dtype, sender.dtype, sender.category)
                stacks.setdefault(key, []).append((pair, p_s, p_r))
    for (_, _, dtype, category), entries in stacks.items():
        _exchange_stack(entries, dtype, category)


def _exchange_one(pair: Pair, p_s: nn.Parameter, p_r: nn.Parameter, sparse: bool | str, rows: Tensor) -> None:
    sender, receiver = pair
    parts = [end._part(p, rows if rows_part(sparse, end.role) else None)
             for end, p in ((sender, p_s), (receiver, p_r))]
    for end, wire in zip(pair, parts, strict=True):
        end.link.count([Packet(end.category, t) for t in wire])
    s, r = (decode_part(wire, sender.dtype) for wire in parts)
    install_sum(p_s, s, r, sparse, rows)
    install_sum(p_r, s, r, sparse, rows)


def _exchange_stack(entries: list[tuple[Pair, nn.Parameter, nn.Parameter]], dtype: str, category: str) -> None:
    """n dense parameters of one shape, both ends: one (2n, ...) stack, sender's part first in each pair."""
    params = [p for _, p_s, p_r in entries for p in (p_s, p_r)]
    wire = encode_part(torch.stack([grad_or_zeros(p) for p in params]), dtype)  # per tensor (2n, ...)
    part_bytes = [math.prod(t.shape[1:]) * t.element_size() for t in wire]  # one end's part of each wire tensor
    for end in (end for pair, _, _ in entries for end in pair):
        for nbytes in part_bytes:
            end.link.count_bytes(category, nbytes)
    decoded = decode_part(wire, dtype)  # (2n, ...)
    sums = (decoded[0::2] + decoded[1::2]).unbind(0)  # sender + receiver, n of them
    doubled = [g for g in sums for _ in range(2)]  # both ends of each pair get the pair's sum
    targets = [(p, g if g.shape == p.shape else g.view_as(p)) for p, g in zip(params, doubled, strict=True)]
    held = [(p, g) for p, g in targets if p.grad is not None]
    if held:  # one copy for every gradient there is; both ends get their own tensor
        torch._foreach_copy_([p.grad for p, _ in held], [g for _, g in held])
    for p, g in targets:
        if p.grad is None:
            p.grad = g.clone()
