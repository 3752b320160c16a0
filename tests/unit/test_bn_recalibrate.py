"""BatchNorm recalibration of a gathered SDP model against hand-computed batch statistics."""

from __future__ import annotations

import torch
from torch import nn

from slimpar.sdp.gather import recalibrate_batchnorm


def test_running_statistics_equal_the_batches_statistics() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1), nn.BatchNorm2d(2))
    model[1].running_mean.fill_(5.0)  # stale statistics, as a holder's subnetwork left them
    model.eval()
    batches = [torch.randn(6, 3, 8, 8) for _ in range(3)]
    assert recalibrate_batchnorm(model, batches) == 2
    assert not model.training and model[1].momentum == 0.1  # mode and momentum restored
    with torch.no_grad():
        pre = [model[0](x) for x in batches]  # the first BatchNorm's inputs, (6, 4, 6, 6) each
    means = torch.stack([p.mean((0, 2, 3)) for p in pre])  # per batch, per channel
    variances = torch.stack([p.var((0, 2, 3), unbiased=True) for p in pre])
    torch.testing.assert_close(model[1].running_mean, means.mean(0))  # equal weights: cumulative average
    torch.testing.assert_close(model[1].running_var, variances.mean(0))
    assert int(model[1].num_batches_tracked) == 3


def test_models_without_batchnorm_are_untouched() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert recalibrate_batchnorm(model, [torch.randn(2, 3)]) == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
