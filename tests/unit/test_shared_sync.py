"""The two ends of a boundary sum their gradient parts of a shared parameter (pipeline/sync.py).

Against a hand computation: both copies get the same gradient, bit for bit, equal to sender part +
receiver part — exactly with ``sync_dtype = fp32``, to within the encoding's rounding with bf16 and
int8 (per-row absmax scale: at most half a step, max|row| / 254, per part) — and the bytes each end
sends are the wire form's size.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from slimpar.pipeline.sync import SharedParamSync, run_phases
from slimpar.pipeline.wire import ByteCounter, LocalLink

D, R = 32, 8


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
def test_both_ends_get_the_summed_gradient(dtype: str) -> None:
    g = torch.Generator().manual_seed(0)
    ends, parts = [], []
    counter = ByteCounter()
    counter.begin_step()
    links = LocalLink.pair(0, counter)
    for role, link in zip(("sender", "receiver"), links, strict=True):
        p = nn.Parameter(torch.zeros(D, R))
        p.grad = torch.randn(D, R, generator=g)
        parts.append(p.grad.clone())
        ends.append((p, SharedParamSync([("A", p, False)], role, link, dtype)))
    run_phases([s for _, s in ends], "post", "finish")
    (a, _), (b, _) = ends
    assert torch.equal(a.grad, b.grad)
    exact = parts[0] + parts[1]
    if dtype == "fp32":
        assert torch.equal(a.grad, exact)
    else:
        bound = (parts[0].abs().amax(1, keepdim=True) + parts[1].abs().amax(1, keepdim=True)) / 254
        if dtype == "bf16":  # 8 significant bits, round to nearest: relative error at most 2^-8 per part
            bound = (parts[0].abs() + parts[1].abs()) * 2.0**-8
        assert ((a.grad - exact).abs() <= bound * (1 + 1e-5) + 1e-7).all()
        assert not torch.equal(a.grad, exact)  # the encoding really is lossy
    size = {"fp32": 4 * D * R, "bf16": 2 * D * R, "int8": D * R + 4 * D}[dtype]
    assert dict(counter.step) == {(0, "fwd", "sync"): size, (0, "bwd", "sync"): size}


def test_unknown_sync_dtype_is_rejected() -> None:
    link, _ = LocalLink.pair(0, ByteCounter())
    with pytest.raises(ValueError, match="sync dtype"):
        SharedParamSync([("A", nn.Parameter(torch.zeros(2, 2)), False)], "sender", link, "fp16")
