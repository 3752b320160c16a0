"""Timing a step function in the bench's own process: the plain loop's rows and the MAPL boundary step."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from slimpar.parallel.syncs import SyncCounter


def time_steps(step: Callable[[], object], warmup: int, steps: int, device: torch.device) -> dict:
    """``warmup`` + ``steps`` calls of ``step`` (each ended by ``torch.cuda.synchronize`` on a GPU), then one more
    under :class:`SyncCounter`. Returns the median of the measured steps, the counted step's aten ops and host
    syncs, and CUDA's peak memory from the first measured step on (None on a CPU)."""
    cuda = device.type == "cuda"
    times = []
    for i in range(warmup + steps):
        if i == warmup and cuda:
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    with SyncCounter() as counter:
        step()
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    return {"step_time_s": statistics.median(times[warmup:]), "aten_ops": counter.count.ops,
            "host_syncs": counter.count.total, "peak_mem_bytes": peak}
