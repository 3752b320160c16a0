"""parallel/device.send / recv hand torch.distributed a tensor on the group's device: over gloo (the host) a GPU
tensor goes through a host copy. On one H200, 4 cuda:gloo SDP ranks failed in the evaluation gather, whose
``dist.recv`` got a CUDA tensor ("writev: Bad address"). No GPU here: the group's device and the tensors' are
stood in for by the CPU and the meta device, and torch.distributed's send and receive are recorded."""

from __future__ import annotations

import torch

from slimpar.parallel import device as dev


def _record(monkeypatch, group_device: str) -> list:
    seen = []
    monkeypatch.setattr(dev, "group_device", lambda group: torch.device(group_device))
    monkeypatch.setattr(dev.dist, "send", lambda t, group, group_dst: seen.append(("send", t.device, group_dst)))

    def recv(t, group, group_src):
        seen.append(("recv", t.device, group_src))
        t.fill_(7)

    monkeypatch.setattr(dev.dist, "recv", recv)
    return seen


def test_a_tensor_off_the_groups_device_is_sent_and_received_through_it(monkeypatch):
    seen = _record(monkeypatch, "cpu")  # gloo: the host
    away = torch.empty(3, device="meta")  # the GPU tensor of a cuda:gloo run
    dev.recv(away, group=None, group_src=1)
    assert seen == [("recv", torch.device("cpu"), 1)]  # into a host buffer, then copied to the tensor's device
    seen = _record(monkeypatch, "meta")
    dev.send(torch.ones(3), group=None, group_dst=2)  # a host tensor for a group on another device
    assert seen == [("send", torch.device("meta"), 2)]


def test_a_tensor_on_the_groups_device_travels_as_it_is(monkeypatch):
    seen = _record(monkeypatch, "cpu")
    t = torch.zeros(3)
    dev.recv(t, group=None, group_src=0)
    dev.send(t, group=None, group_dst=1)
    assert torch.equal(t, torch.full((3,), 7.0)) and [s[1].type for s in seen] == ["cpu", "cpu"]
