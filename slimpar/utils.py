"""Small helpers shared by every layer (bottom layer: imports nothing else of slimpar)."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def fmt_bytes(n: float | None) -> str:
    """A byte count for people: ``1536`` -> ``"1.5 KiB"``; ``None`` -> ``"-"``."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux tells it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore at once (not atomic, hence the /proc path first)
    os.umask(mask)
    return mask


def chmod_as_created(path: str | os.PathLike[str]) -> None:
    """Give ``path`` the mode an ordinary ``open(path, "w")`` would: 0666 less the umask (0644 under 022).

    Writers that go through a private temporary file (``mkstemp``, safetensors' ``save_file``) leave 0600,
    which hides run outputs from the other users of a shared machine.
    """
    os.chmod(path, 0o666 & ~current_umask())


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: a reader in another process (a rank
    comparing the run's ``config.toml`` while rank 0 rewrites it) sees the old file or the new one, never a
    truncated one."""
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:  # a full disk: no partial temporary file is left behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def exit_failed(code: int) -> NoReturn:
    """End a process that failed with ``code`` now, without the interpreter's teardown.

    Order: join its non-daemon threads, run its ``atexit`` handlers (multiprocessing's, logging's, torch's),
    flush stdout and stderr, then ``os._exit``. What is skipped is the teardown of modules and C++ statics:
    about 0.6 s after a bare ``import torch`` and 1.5 s after a failed training worker on 2 cores, several times
    that on a loaded machine. A job that gave up on a hung collective waits for every worker and the launcher to
    exit before it can end, so that teardown added seconds past ``parallel.timeout_s``. Nothing is lost: a run's
    files are closed before its processes raise ``SystemExit``, and what ``atexit`` would do still runs.
    """
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon:
            t.join()
    atexit._run_exitfuncs()  # CPython's own exit step (3.8+), the one the interpreter runs before its teardown
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
