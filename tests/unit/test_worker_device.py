"""Each worker's GPU is chosen in one place (job/context.worker_device) on every start path: torchrun's
(init_context) and slimpar's launcher's attempt group (worker.init_attempt_group). On the H200 the launcher's
path took the local rank alone, so rank 1 of two cuda:gloo ranks on one GPU failed with "invalid device ordinal"
(docs/results/gpu/2026-12-04-388788f). No CUDA here: torch.cuda's device count and set_device are stood in for."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from slimpar.config import load_config
from slimpar.train.job import context
from slimpar.train.launch import worker
from tests.helpers import TINY


def _cfg(backend: str):
    cfg = load_config(TINY)
    cfg.parallel.device, cfg.parallel.backend, cfg.parallel.workers = "cuda", backend, 2
    return cfg


@pytest.fixture
def one_gpu(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


@pytest.mark.parametrize("backend, gpu, bound", [("gloo", 0, False), ("nccl", 1, True)])
def test_the_launchers_attempt_group_takes_the_shared_gpu_rule(monkeypatch, one_gpu, backend, gpu, bound):
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": "2",
           "RANK": "1", "LOCAL_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "0"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    calls = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "TCPStore", lambda *a, **k: object())
    monkeypatch.setattr(dist, "PrefixStore", lambda prefix, store: store)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend, **kw))
    worker.init_attempt_group(_cfg(backend))
    assert one_gpu == [torch.device("cuda", gpu)]  # gloo: both ranks on the one GPU; NCCL: its own
    assert calls["backend"] == backend
    assert calls["device_id"] == (torch.device("cuda", gpu) if bound else None)


def test_the_cpu_is_the_cpu(one_gpu):
    cfg = _cfg("gloo")
    cfg.parallel.device = "cpu"
    assert context.worker_device(cfg) == torch.device("cpu") and one_gpu == []
