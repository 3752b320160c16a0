"""Where this process sits on its machine: which of the machine's GPUs it drives, and how many of the job's
processes share the machine (docs/multinode.md).

torchrun and slimpar's launcher say both (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``). A bare ``srun`` that starts one
process per task says them its own way: ``SLURM_LOCALID`` is the task's index on its node, and
``SLURM_STEP_TASKS_PER_NODE`` (``SLURM_TASKS_PER_NODE`` outside a step) lists the tasks per node as
``2(x3),1`` (three nodes with two tasks, then one with one), indexed by ``SLURM_NODEID``. Without either, the
process is alone (local rank 0) or every worker of the job runs on this machine (slimpar's own launcher).
``RANK`` / ``WORLD_SIZE`` are global and say nothing of the machine: two nodes of four GPUs are ranks 0-7, and
rank 5 drives GPU 1 of the second node.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

_RUN = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def local_rank(env: Mapping[str, str] = os.environ) -> int:
    """This process's index among the job's processes on its machine: its GPU is ``cuda:<local_rank>``."""
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        if env.get(name, "").strip():
            return int(env[name])
    return 0


def gpu_index(local: int, gpus: int, backend: str = "auto") -> int:
    """The GPU a process of local rank ``local`` drives: its own, one per process; with gloo (which also reduces
    CUDA tensors, unlike NCCL it takes several ranks on one GPU) the local ranks take the GPUs in turn."""
    return local % max(gpus, 1) if backend == "gloo" else local


@dataclass(frozen=True)
class DeviceChoice:
    """What ``parallel.device`` / ``parallel.backend`` became on this machine, and what the choice rested on."""

    device: str  # cpu | cuda
    backend: str  # gloo | nccl
    gpus: int  # CUDA devices this process sees
    local: int  # worker processes on this machine
    note: str = ""  # why ``auto`` left this machine's GPUs unused; "" where it did not


def choose_device(device: str, backend: str, gpus: int, local: int) -> DeviceChoice:
    """Resolve ``auto`` for ``local`` worker processes on a machine with ``gpus`` GPUs (a pure function of them).

    ``device = "auto"`` is the CPU without a GPU, and CUDA where every local worker gets a GPU of its own. With
    fewer GPUs than workers an explicit backend decides: ``gloo`` lets workers share the GPUs (``gpu_index``),
    ``nccl`` takes CUDA and the validator refuses it with both counts; with ``backend = "auto"`` it is the CPU,
    with a note that names the counts and the ways to use the GPUs, never in silence. ``backend = "auto"`` is
    NCCL on CUDA, gloo on the CPU.
    """
    note = ""
    if device == "auto":
        device = "cuda" if gpus and (gpus >= local or backend != "auto") else "cpu"
        if device == "cpu" and gpus:
            them = "it" if gpus == 1 else "them"
            note = (f"note: {_count(gpus, 'GPU')} here for {_count(local, 'local worker')}, which need one GPU "
                    f"each with NCCL: training on the CPU. To share {them} over gloo: --parallel.device cuda "
                    f"--parallel.backend gloo; or run {gpus} worker(s) per machine (--parallel.workers {gpus}, "
                    f"or torchrun --nproc_per_node {gpus})")
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    return DeviceChoice(device, backend, gpus, local, note)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def local_world_size(env: Mapping[str, str] = os.environ, default: int = 1) -> int:
    """How many of the job's processes run on this machine; ``default`` when neither torchrun nor srun says."""
    if env.get("LOCAL_WORLD_SIZE", "").strip():
        return int(env["LOCAL_WORLD_SIZE"])
    tasks = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if tasks and env.get("SLURM_LOCALID", "").strip():
        return slurm_tasks_on_node(tasks, int(env.get("SLURM_NODEID", "0")))
    return default


def slurm_tasks_on_node(tasks_per_node: str, node: int) -> int:
    """The entry for node ``node`` (0-based) of a SLURM tasks-per-node list such as ``2(x3),1``."""
    seen = 0
    for part in tasks_per_node.split(","):
        m = _RUN.match(part.strip())
        if m is None:
            raise ValueError(f"cannot read SLURM tasks per node {tasks_per_node!r}")
        count, repeat = int(m.group(1)), int(m.group(2) or 1)
        if node < seen + repeat:
            return count
        seen += repeat
    raise ValueError(f"SLURM tasks per node {tasks_per_node!r} lists {seen} node(s); this is node {node}")
