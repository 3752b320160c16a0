"""The trainer's AdamW runs torch's fused kernel on plain parameters (no Python loop and no host read of a step
counter per parameter), foreach on FSDP2 shards, and the loop where the two kinds mix; fused equals the loop."""

import torch
from torch import nn

from slimpar.optim.adamw import adamw_kernels


class _Shard(torch.Tensor):  # stands in for a DTensor: adamw_kernels tells them apart by to_local
    def to_local(self):
        return self


def test_kernels_by_kind_of_parameter():
    plain = [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2, 2))]
    shards = [torch.zeros(3).as_subclass(_Shard)]
    assert adamw_kernels(plain) == {"fused": True}
    assert adamw_kernels(shards) == {"foreach": True}
    assert adamw_kernels(plain + shards) == {"foreach": False}


def test_fused_adamw_equals_the_loop_to_rounding():
    torch.manual_seed(0)
    a, b = nn.Linear(16, 8), nn.Linear(16, 8)
    b.load_state_dict(a.state_dict())
    fused = torch.optim.AdamW(a.parameters(), lr=1e-2, **adamw_kernels(list(a.parameters())))
    loop = torch.optim.AdamW(b.parameters(), lr=1e-2, foreach=False)
    for _ in range(5):
        x = torch.randn(4, 16)
        for m, opt in ((a, fused), (b, loop)):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
