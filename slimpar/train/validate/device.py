"""``parallel.device = "auto"`` and ``parallel.backend = "auto"`` become this machine's device and backend here,
once, before any process group exists; everything after (validation, the launcher, the workers, the run's
``config.toml``) reads the resolved values. The rule itself is :func:`slimpar.parallel.placement.choose_device`.

Under slimpar's launcher the workers receive the resolved config; under torchrun every rank resolves alike on
its own node (the same GPUs, the same ``LOCAL_WORLD_SIZE``). A resumed run resolves again: the device and
backend may differ from the folder's ``config.toml`` without being a change of the run (launch/rerun.py).
"""

from __future__ import annotations

from slimpar.config import Config
from slimpar.parallel.placement import DeviceChoice, choose_device, local_world_size
from slimpar.train.validate.processes import runs_in_process


def local_workers(cfg: Config) -> int:
    """Worker processes on this machine: one for an in-process run, torchrun's LOCAL_WORLD_SIZE (or a bare srun's
    tasks on this node), else every worker (slimpar's launcher). Never the job's total: two nodes of four GPUs
    run eight workers, four on each."""
    return 1 if runs_in_process(cfg) else local_world_size(default=cfg.parallel.workers)


def visible_gpus() -> int:
    """CUDA devices this process may use (0 without CUDA: ``device_count`` alone can count a GPU whose driver
    does not start)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(cfg: Config) -> DeviceChoice:
    """Write this machine's choice into ``cfg.parallel`` (``auto`` no longer appears in it) and return it."""
    p = cfg.parallel
    gpus = 0 if p.device == "cpu" else visible_gpus()  # a CPU run asks nothing of CUDA
    choice = choose_device(p.device, p.backend, gpus, local_workers(cfg))
    p.device, p.backend = choice.device, choice.backend
    return choice


def start_line(cfg: Config, choice: DeviceChoice) -> str:
    """``slimpar: device cuda (1 GPU per worker), backend nccl, dtype bf16``: what a run prints as it starts."""
    if choice.device == "cpu":
        where = "cpu"
    elif choice.backend == "gloo" and choice.local > choice.gpus:
        where = f"cuda ({choice.local} workers share {choice.gpus} GPU{'s' if choice.gpus > 1 else ''})"
    else:
        where = "cuda (1 GPU per worker)"
    backend = "none (one process)" if runs_in_process(cfg) else choice.backend
    return f"slimpar: device {where}, backend {backend}, dtype {cfg.train.dtype}"
