"""Workers respect the user's OMP_NUM_THREADS and otherwise split the cores among local workers."""

import os

import pytest
import torch

from slimpar.train.job.context import _share_cores


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_explicit_omp_num_threads_wins(monkeypatch, restore_threads):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    torch.set_num_threads(1)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    _share_cores(world=1)
    assert torch.get_num_threads() == 1  # not 64


def test_cores_are_split_among_local_workers(monkeypatch, restore_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    _share_cores(world=4)
    assert torch.get_num_threads() == 2
