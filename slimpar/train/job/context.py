"""What a worker knows about its place in the job: rank, world, device, run folder and process group.

Every process group gets ``parallel.timeout_s``: without it a stopped or deadlocked worker hangs the
whole job silently (gloo's default is 30 minutes); with it the waiting ranks fail and the launcher ends
the run (see slimpar.train.launch.worker for the message).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from slimpar.config import Config
from slimpar.parallel.placement import gpu_index, local_rank, local_world_size
from slimpar.train.modes import mode_of


@dataclass
class RunContext:
    rank: int
    world: int
    device: torch.device
    out_dir: Path
    group: dist.ProcessGroup | None  # the data-parallel WORLD group; None when single-process
    timeout: timedelta | None = None  # bound on every collective; strategies pass it to the groups they create

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def nccl_device_id(backend: str, device: torch.device) -> torch.device | None:
    """``init_process_group``'s ``device_id``: the GPU an NCCL group binds to (eager start, ncclCommSplit for
    sub-groups); None for gloo, whose ranks may share one GPU."""
    return device if backend == "nccl" and device.type == "cuda" else None


def init_context(cfg: Config, out_dir: Path) -> RunContext:
    """Create the process group when the environment (torchrun or slimpar's launcher) defines one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = worker_device(cfg)  # this machine's GPU: LOCAL_RANK, or SLURM_LOCALID under srun
    if device.type == "cpu":
        _share_cores(world)
    group = None
    timeout = timedelta(seconds=cfg.parallel.timeout_s)
    if mode_of(cfg).needs_group(cfg, world):
        if not dist.is_initialized() and "MASTER_ADDR" in os.environ:
            dist.init_process_group(cfg.parallel.backend, device_id=nccl_device_id(cfg.parallel.backend, device),
                                    timeout=timeout)
        if dist.is_initialized():
            group = dist.group.WORLD
    return RunContext(rank=rank, world=world, device=device, out_dir=out_dir, group=group, timeout=timeout)


def worker_device(cfg: Config) -> torch.device:
    """The device this worker trains on, made current: on CUDA this machine's GPU number ``local_rank`` (LOCAL_RANK,
    or SLURM_LOCALID under srun), or the GPUs in turn where gloo workers share them.

    Every path that starts a worker's process group takes its device here: the launcher's attempt group once took
    the local rank alone, and rank 1 of two on one GPU over gloo failed with "invalid device ordinal" (H200).
    ``cfg`` must be resolved (slimpar.train.validate.device): an ``auto`` here would train on the CPU unasked."""
    p = cfg.parallel
    if "auto" in (p.device, p.backend):
        raise ValueError("a worker needs a resolved parallel.device and parallel.backend (resolve_device)")
    if p.device != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", gpu_index(local_rank(), torch.cuda.device_count(), p.backend))
    torch.cuda.set_device(device)
    return device


def _share_cores(world: int) -> None:
    """Give each local CPU worker its share of the cores, unless the user chose a thread count.

    An explicit ``OMP_NUM_THREADS`` always wins (torch reads it at start-up); without it, local workers
    split ``os.cpu_count()`` instead of each starting a full-size pool and oversubscribing the machine.
    """
    if os.environ.get("OMP_NUM_THREADS"):
        return
    local_world = local_world_size(default=world)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(local_world, 1)))
