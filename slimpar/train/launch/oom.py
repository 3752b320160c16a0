"""Naming an out-of-memory kill: the kernel's OOM killer ends a worker with SIGKILL, which alone looks like any kill.

Evidence, read after a worker of slimpar's launcher died by SIGKILL (either is enough):

1. the kernel log names its pid ("Out of memory: Killed process 1234 (python)", "Memory cgroup out of memory:
   Killed process 1234 ..."), read with ``dmesg`` where this user may read it;
2. the OOM kills counted by this process's memory cgroup grew since the job started: cgroup v2
   ``memory.events`` (``oom_kill N``), v1 ``memory.oom_control`` (the kernel counts a kill in the victim's cgroup,
   which the workers share with their launcher). A count cannot tell which worker: every worker that died by
   SIGKILL in that job is named.

Such a failure is not restarted (``--max-restarts``): the same settings run out of memory again.
"""

from __future__ import annotations

import re
import signal
import subprocess


def oom_kill_count() -> int | None:
    """The OOM kills counted in this process's memory cgroup (None: no readable counter)."""
    from slimpar.train.validate.memory_floor import memory_cgroup_files

    for path in memory_cgroup_files("memory.events", "memory.oom_control"):
        try:
            match = re.search(r"^oom_kill (\d+)$", path.read_text(), re.M)
        except OSError:
            continue
        if match:
            return int(match.group(1))
    return None


def _kernel_log() -> str:
    try:
        return subprocess.run(["dmesg"], capture_output=True, text=True, timeout=3, errors="replace").stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def oom_killed(pids: dict[int, int], count_before: int | None, log: str | None = None) -> list[int]:
    """Of ``pids`` (rank -> pid of the workers that died by SIGKILL), the ranks the OOM killer ended.

    ``count_before``: :func:`oom_kill_count` when the job started; ``log``: the kernel log (read when None)."""
    if not pids:
        return []
    log = _kernel_log() if log is None else log
    named = [rank for rank, pid in pids.items() if re.search(rf"Killed process {pid}\b", log)]
    if named:
        return sorted(named)
    after = oom_kill_count()
    if count_before is not None and after is not None and after > count_before:
        return sorted(pids)
    return []


def sigkilled(failures: dict) -> dict[int, int]:
    """rank -> pid of the failures (torch's ProcessFailure records) that ended by SIGKILL."""
    return {rank: f.pid for rank, f in failures.items() if getattr(f, "exitcode", 0) == -signal.SIGKILL}


def oom_message(ranks: list[int], machine: str) -> str:
    who = f"rank {ranks[0]} was" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} were"
    return (f"slimpar: error: {who} killed by the kernel's out-of-memory killer: the workers on this machine needed "
            f"more than its {machine}. `slimpar plan --memory` with this run's settings predicts each worker's peak; "
            "lower --train.batch_size (or raise --train.grad_accum), --sdp.keep, --parallel.workers or --model.size. "
            "Not restarted: the same settings would run out of memory again")
