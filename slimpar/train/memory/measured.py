"""The instrumented step's record (``log.measure_step``): exact memory by part, bytes into collectives, the host
syncs and ops a GPU run would see, one per rank in ``summary.json`` (docs/outputs.md)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from slimpar.parallel.comm import StepInstrument, wire_bytes_written
from slimpar.parallel.device import cuda_memory
from slimpar.train.memory import accounting as memory


def measured_step(step: Callable, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  device: torch.device) -> tuple[object, dict]:
    """Run ``step(instrument, saved)`` under exact accounting; returns its result and the record."""
    static = {**memory.param_storages(model), **memory.optimizer_storages(optimizer),
              **memory.buffer_storages(model), **memory.grad_storages(model)}
    saved = memory.SavedActivations(exclude=memory.param_storages(model))
    rss0, wire0 = memory.reset_peak_rss(), wire_bytes_written()
    # eager under the instrument (a dispatch mode): dynamo, meeting the mode in a compiled block, would give up on
    # that block's code for the rest of the process, and every later step would run eager (measured: a compiled
    # run's blocks were not called again after the instrumented step); the stance runs this step eagerly and keeps
    # the compiled graphs. torch.compiler.set_stance: torch 2.6, below slimpar's floor.
    with torch.compiler.set_stance("force_eager"), StepInstrument() as inst:
        result = step(inst, saved)
    wire1, rss_peak = wire_bytes_written(), memory.peak_rss()
    grads = memory.grad_storages(model)
    persistent = {k: n for k, n in grads.items() if k not in inst.allocated and k not in static}
    record = {
        "mem": {
            "params": sum(memory.param_storages(model).values()),
            "grads": sum(grads.values()),
            "optimizer": sum(memory.optimizer_storages(optimizer).values()),
            "buffers": sum(memory.buffer_storages(model).values()),
            "activations": saved.bytes,
            "peak_live": sum(static.values()) + sum(persistent.values()) + inst.peak,
            "peak_step_alloc": inst.peak,  # what the RSS increase cross-checks
            "peak_rss_delta": (rss_peak - rss0) if rss0 is not None and rss_peak is not None else None,
        },
        "comm_bytes": inst.comm_bytes,
        "comm_by_op": dict(inst.comm),
        "comm_calls": dict(inst.calls),
        "host_syncs": inst.count.total,  # where a GPU run would wait for the device (parallel/syncs.py)
        "host_syncs_by_kind": dict(inst.count.syncs),
        "aten_ops": inst.count.ops,  # ops launched in the step
        **cuda_memory(device),  # the allocator's peaks so far, on a GPU
        **inst.traffic(),  # modelled bytes sent and received (parallel/comm.traffic)
        "wire_bytes": (wire1 - wire0) if wire0 is not None and wire1 is not None else None,
    }
    return result, record
