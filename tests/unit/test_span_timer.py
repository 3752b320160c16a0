"""SPEL's timing (slimpar.optim.timing): a CPU span is the host's wall time; a CUDA span is two events on the
device's stream, and nothing waits for the device until the number is read. The CUDA half runs on stand-ins for
torch's events and stream that record what was asked of them, with ``torch.cuda.synchronize`` made to fail: the
step that the old SPEL timing synchronised on every call."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from slimpar.codecs.stiefel import random_stiefel
from slimpar.optim.spel import SPELAdamW
from slimpar.optim.timing import SpanTimer, SpanTotal


def test_a_cpu_span_is_the_host_wall_time() -> None:
    t0 = time.perf_counter()
    timer = SpanTimer.start(torch.device("cpu"))
    time.sleep(0.05)
    timer.stop()
    outer = time.perf_counter() - t0
    assert 0.05 <= timer.seconds <= outer


class _Log:
    def __init__(self) -> None:
        self.calls: list[str] = []


def _fake_cuda(monkeypatch, log: _Log, elapsed_ms: float) -> None:
    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.recorded = None

        def record(self, stream) -> None:
            log.calls.append(f"record on {stream}")
            self.recorded = stream

        def synchronize(self) -> None:
            log.calls.append("event synchronize")

        def elapsed_time(self, end) -> float:
            assert self.recorded is not None and end.recorded is not None
            return elapsed_ms

    def synchronize(device=None) -> None:
        raise AssertionError("the span made the host wait for the whole device")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream of {device}")
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)


def test_a_cuda_span_waits_for_nothing_until_it_is_read(monkeypatch) -> None:
    log = _Log()
    _fake_cuda(monkeypatch, log, elapsed_ms=2.5)
    timer = SpanTimer.start(torch.device("cuda", 1)).stop()
    assert log.calls == ["record on stream of cuda:1"] * 2  # start and end, on the device's current stream
    assert timer.seconds == pytest.approx(2.5e-3)
    assert log.calls[2:] == ["event synchronize"]  # the read waits for the end event alone
    assert timer.seconds == pytest.approx(2.5e-3)
    assert len(log.calls) == 3  # read once: the events are not asked again


def test_a_total_counts_each_span_once() -> None:
    """A skipped optimizer step leaves the last step's timer in place; adding it again must not count it twice."""
    spans = [SpanTimer(None, 0.0) for _ in range(2)]
    for span, seconds in zip(spans, (0.25, 0.5), strict=True):
        span._seconds = seconds
    total = SpanTotal()
    total.add(spans[0])
    total.fold()
    total.add(spans[0])  # the skipped step
    total.add(spans[1])
    assert total.seconds == pytest.approx(0.75)
    assert total.seconds == pytest.approx(0.75)


def test_spel_step_keeps_a_new_span_each_step() -> None:
    A = nn.Parameter(random_stiefel(32, 8, torch.Generator().manual_seed(0)))
    opt = SPELAdamW([{"params": [A], "manifold": "stiefel"}], lr=1e-2)
    seen = []
    for _ in range(2):
        A.grad = torch.randn(32, 8, generator=torch.Generator().manual_seed(len(seen)))
        opt.step()
        seen.append(opt.last_spel_timer)
    assert seen[0] is not seen[1]
    assert all(t.seconds > 0 for t in seen) and opt.last_spel_seconds == seen[1].seconds
