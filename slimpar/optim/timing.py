"""How long a span of an optimizer's work took, without making the host wait for the device to measure it.

On the CPU the work runs as it is called, so the span is the host's wall time. On a GPU the host only queues
kernels: a wall-clock span ends before the kernels run, and waiting for them (``torch.cuda.synchronize``) both
stalls the host in every step and counts whatever was still queued before the span (an optimizer's other groups,
a backward's tail) as the span's own. So on CUDA the span is two timing events recorded on the device's current
stream, and the elapsed time is read only when asked for, by which time (after the step's own end) the events have
long passed.
"""

from __future__ import annotations

import time

import torch


class SpanTimer:
    """``SpanTimer.start(device)`` where the span begins, :meth:`stop` where it ends, :attr:`seconds` when the number
    is needed.

    ``device``: where the span's kernels run. For CUDA, reading :attr:`seconds` waits for the end event alone (no
    wait at all once the device has passed it); everywhere else (or with no device) it is the host's wall time and
    never waits.
    """

    def __init__(self, events: tuple | None, t0: float) -> None:
        self._events = events
        self._t0 = t0
        self._seconds: float | None = None

    @classmethod
    def start(cls, device: torch.device | None) -> SpanTimer:
        if device is None or device.type != "cuda":
            return cls(None, time.perf_counter())
        stream = torch.cuda.current_stream(device)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        return cls((begin, end, stream), 0.0)

    def stop(self) -> SpanTimer:
        if self._events is None:
            self._seconds = time.perf_counter() - self._t0
        else:
            _, end, stream = self._events
            end.record(stream)
        return self

    @property
    def seconds(self) -> float:
        """The span in seconds (0.0 if it never stopped)."""
        if self._seconds is None and self._events is not None:
            begin, end, _ = self._events
            end.synchronize()
            self._seconds = begin.elapsed_time(end) / 1e3
            self._events = None  # the events are freed; the number stays
        return self._seconds or 0.0


class SpanTotal:
    """The sum of spans over a run, each read once it has ended: :meth:`add` each step's timer (the same timer added
    again, as a skipped optimizer step leaves it, counts once), :meth:`fold` where the step's end has been waited
    for (so reading waits for nothing), :attr:`seconds` for the total."""

    def __init__(self) -> None:
        self._seconds = 0.0
        self._pending: list[SpanTimer] = []
        self._last: SpanTimer | None = None

    def add(self, timer: SpanTimer) -> None:
        if timer is not self._last:
            self._last = timer
            self._pending.append(timer)

    def fold(self) -> None:
        self._seconds += sum(t.seconds for t in self._pending)
        self._pending.clear()

    @property
    def seconds(self) -> float:
        self.fold()
        return self._seconds
