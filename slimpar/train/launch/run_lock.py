"""One job per run folder: ``slimpar train`` holds an exclusive lock on ``<out>/.slimpar.lock`` while it runs.

Two jobs writing one folder (a benchmark restarted while its old runs still train, the same command in two
terminals) would interleave their metrics and overwrite each other's checkpoints, and the run would then resume
from a mix of both without a word. The second job stops instead, before it writes anything, with the first one's
pid. The launching process holds the lock (rank 0 under torchrun), through every elastic restart.

Written by hand on ``fcntl.flock`` (POSIX, this project's platform): the kernel drops the lock when its process
ends, however it ends (a crash or ``kill -9`` leaves no stale lock), which a pid file alone cannot give.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from slimpar.config import ConfigError

LOCK = ".slimpar.lock"


class RunFolderInUse(ConfigError):
    """Another live process holds the run folder's lock."""


@contextlib.contextmanager
def run_lock(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir``'s lock for the block (the folder is created if needed); raise :class:`RunFolderInUse`
    at once where another process holds it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise RunFolderInUse(
                f"run folder {out_dir} is in use by another slimpar train job (pid {holder}): two jobs writing one "
                f"folder would mix their metrics and checkpoints. Wait for it to end, stop it (kill {holder}), or "
                f"pass another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
