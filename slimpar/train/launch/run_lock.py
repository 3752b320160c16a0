"""One job per run folder: ``slimpar train`` holds an exclusive lock on ``<out>/.slimpar.lock`` while it runs.

Two jobs writing one folder (a benchmark restarted while its old runs still train, the same command in two
terminals) would interleave their metrics and overwrite each other's checkpoints, and the run would then resume
from a mix of both without a word. The second job stops instead, before it writes anything, with the first one's
pid. The launching process holds the lock (rank 0 under torchrun), through every elastic restart.

Written by hand on ``fcntl.flock`` (POSIX, this project's platform): the kernel drops the lock when its process
ends, however it ends (a crash or ``kill -9`` leaves no stale lock), which a pid file alone cannot give.

The launcher's lock alone ends with the launcher, and workers can outlive it by seconds: a killed launcher's
workers finish their step and save (:mod:`slimpar.train.job.parent`). So every worker of a launcher also
holds a lock of its own, ``<out>/.slimpar-workers/<host>-<launcher pid>-<pid>.lock``, until it exits
(:func:`hold_worker_lock`); a new job that finds one of another launcher on this host still locked stops and
names the pids. The files of the job's own launcher are skipped (under torchrun rank 0 takes the run lock while
its sibling ranks may already hold theirs), and a file nobody holds is a dead worker's and is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from slimpar.config import ConfigError

LOCK = ".slimpar.lock"
WORKERS = ".slimpar-workers"  # one lock file per live worker of a launcher


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
        os.pwrite(fd, f"{os.getpid()}\n{_torchrun_job()}\n".encode(), 0)
        _refuse_live_workers(out_dir)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _job_key(launcher: int) -> str:
    return f"{socket.gethostname()}-{launcher}"


def _torchrun_job() -> str:
    """This torchrun job's rendezvous id (the same on every node of one job), or "" outside torchrun or where the
    id is torchrun's default "none" (two such jobs could not be told apart)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return "" if run_id in ("", "none") else run_id


def hold_worker_lock(out_dir: Path) -> None:
    """Lock this worker's file in ``out_dir``'s worker folder for the rest of this process (the descriptor stays
    open on purpose: the kernel releases the lock when the process ends). Best effort: a file system without
    ``flock`` leaves the launcher's lock alone."""
    folder = Path(out_dir) / WORKERS
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / f"{_job_key(os.getppid())}-{os.getpid()}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, f"{os.getpid()}\n{_torchrun_job()}\n".encode(), 0)
    except OSError:
        return


def live_workers(out_dir: Path) -> list[int]:
    """Pids of workers of other launchers on this host that still hold their lock in ``out_dir``; the files of
    exited workers are removed. The caller holds the run lock, so no new worker of another job appears meanwhile."""
    own = _job_key(os.getpid()), _job_key(os.getppid())  # slimpar's launcher itself; a torchrun rank's agent
    host = f"{socket.gethostname()}-"
    pids = []
    folder = Path(out_dir) / WORKERS
    for path in sorted(folder.glob(f"{host}*.lock")) if folder.is_dir() else []:
        if path.name.rsplit("-", 1)[0] in own:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)  # its worker has exited
        except BlockingIOError:  # a live worker: of another job, unless it is this torchrun job on another node
            job = _torchrun_job()  # (nodes that share a hostname, e.g. network namespaces of one machine)
            if not job or os.pread(fd, 4096, 0).decode(errors="replace").split("\n")[1:2] != [job]:
                pids.append(int(path.stem.rsplit("-", 1)[1]))
        except OSError:
            pass
        finally:
            os.close(fd)
    return pids


def _refuse_live_workers(out_dir: Path) -> None:
    pids = live_workers(out_dir)
    if pids:
        listed = " ".join(map(str, pids))
        raise RunFolderInUse(
            f"run folder {out_dir} is in use by {len(pids)} worker(s) of an earlier slimpar train job whose launcher "
            f"is gone (pids {listed}): they are finishing their step and saving it, and exit at the latest "
            f"checkpoint.on_signal_s after their launcher's end. Wait for them, stop them (kill {listed}), or pass "
            "another --out")
