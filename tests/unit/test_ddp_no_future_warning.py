"""DDP is built the way torch now wants: no ``broadcast_buffers`` FutureWarning, same buffer syncing as before."""

import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

from slimpar.models.llama import Llama, LlamaConfig
from slimpar.parallel.compat import ddp_syncs_buffers_each_forward
from slimpar.train.strategies.base import DDPStrategy


@pytest.fixture
def one_process_group(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("model, syncs_each_forward", [
    (lambda: Llama(LlamaConfig.tiny()), False),  # rotary tables are constants
    (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), True),  # BatchNorm statistics are state
])
def test_ddp_strategy_warns_nothing(one_process_group, model, syncs_each_forward):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strategy = DDPStrategy(model(), one_process_group)
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]
    assert ddp_syncs_buffers_each_forward(strategy.module) is syncs_each_forward
    assert isinstance(strategy.module, torch.nn.parallel.DistributedDataParallel)
