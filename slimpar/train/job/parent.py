"""Workers end with their launcher: no worker outlives the process that started it.

torch's elastic agent (slimpar's launcher and torchrun alike) starts every worker in a session of its own, so a
worker survives its launcher's death: after a ``kill -9`` of the launcher its workers trained on, and the same
command, finding the run lock free, started a second job in the same folder.

Each worker therefore asks the kernel for a death signal, ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` (Linux), as its
first act: when the launcher dies, however it dies, the worker gets SIGTERM, which is the stop signal of
:mod:`slimpar.train.job.preempt`: it finishes its step, saves the checkpoint there and exits within
``checkpoint.on_signal_s``. SIGTERM rather than SIGKILL: the steps since the last checkpoint are kept, and the wait
is bounded by the grace timer. Until the last worker has exited its lock file keeps the run folder from a second
job (:mod:`slimpar.train.launch.run_lock`).

A launcher that died before the worker set the signal is caught by comparing the parent pid with the launcher's,
which slimpar's launcher passes in :data:`LAUNCHER_PID`. torchrun passes none, and its workers' parent may be pid 1
(torchrun as a container's first process), so under torchrun that short window at start-up stays open.
This module imports nothing heavy: a worker runs it before it imports torch.
"""

from __future__ import annotations

import os
import signal

LAUNCHER_PID = "SLIMPAR_LAUNCHER_PID"  # set by slimpar's launcher for its workers
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(expected_parent: int | None = None) -> bool:
    """Ask for SIGTERM when this process's parent dies; returns whether the kernel took the request.

    ``expected_parent``: the launcher's pid; where the parent is already another process (the launcher died while
    this one started) this process sends itself SIGTERM at once."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):  # not Linux: the launcher's own shutdown is all there is
        return False
    if expected_parent and os.getppid() != expected_parent:
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def launcher_pid() -> int | None:
    """The pid of the slimpar launcher that started this worker (None: another launcher, or none)."""
    value = os.environ.get(LAUNCHER_PID, "")
    return int(value) if value.isdigit() else None


def launcher_alive() -> bool:
    """Whether this process is a worker of slimpar's launcher and that launcher is still its parent (it then
    prints the run's closing line; otherwise the worker's rank 0 does)."""
    pid = launcher_pid()
    return pid is not None and os.getppid() == pid
