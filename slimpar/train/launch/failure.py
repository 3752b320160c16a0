"""Failures that a restart would only repeat, recorded so that no launcher retries them.

``--max-restarts N`` (slimpar's launcher or torchrun's) restarts every worker from the newest checkpoint
after any failure. That helps after a lost worker, a timeout or a replica mismatch, but a diverged run (the
NaN guard) or an input error (exit 2) fails again the same way, N times over. A worker that ends with one of
those writes :data:`MARKER` in the run folder before it exits:

- slimpar's launcher reads it after the failure and does not restart (:func:`slimpar.train.launch.launcher.launch`);
- under torchrun, whose agent restarts regardless, a restarted worker finds it and exits at once, before it
  builds anything; the first worker of that attempt to find it prints its message (:func:`first_to_say`).

A new invocation (``restart_count() == 0``) clears it: the user has changed something.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

from slimpar.utils import write_text_atomic

MARKER = ".slimpar-failed-for-good.json"


def record(out_dir: str | Path, what: str, message: str, exit_code: int) -> None:
    """Write the marker (atomically; every failing rank may, the content is the same verdict). ``what`` names
    the failure in a few words ("the NaN guard"), ``message`` is the paragraph the worker printed."""
    path = Path(out_dir) / MARKER
    try:
        write_text_atomic(path, json.dumps({"what": what, "message": message, "exit_code": exit_code}))
    except OSError:  # a full or read-only disk: the launcher then retries, which is the old behaviour
        pass


def read(out_dir: str | Path) -> tuple[str, str, int] | None:
    """(what, message, exit code) of a failure recorded in this run folder, or None."""
    try:
        data = json.loads((Path(out_dir) / MARKER).read_text())
        return str(data["what"]), str(data["message"]), int(data["exit_code"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def clear(out_dir: str | Path) -> None:
    for path in (Path(out_dir) / MARKER, *Path(out_dir).glob(f"{MARKER}.said-*")):
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def first_to_say(out_dir: str | Path, attempt: int) -> bool:
    """Whether this worker is the first of restart ``attempt`` to claim the recorded failure's message (an
    exclusive create beside the marker), so that exactly one worker prints it. Why not rank 0 alone: a worker
    that exits makes the agent stop the others, and rank 0 may still be starting then; its message was lost.
    Where the folder cannot be written, rank 0 says it."""
    try:
        os.close(os.open(Path(out_dir) / f"{MARKER}.said-{attempt}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except FileExistsError:
        return False
    except OSError:
        return int(os.environ.get("RANK", "0")) == 0


def not_retried(what: str) -> str:
    return f"slimpar: not restarted (--max-restarts): {what} would stop every restart the same way"


def debugging() -> bool:
    """``--debug`` or ``SLIMPAR_DEBUG=1``: internal errors show their traceback (workers inherit it)."""
    return os.environ.get("SLIMPAR_DEBUG", "") not in ("", "0")


def internal_error(e: BaseException, who: str = "") -> str:
    """The one paragraph of an unexpected error: what, where (the innermost slimpar line), how to see more."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/slimpar/" in f.filename.replace("\\", "/")]
    where = ""
    if frames:
        f = frames[-1]
        where = f" at slimpar/{f.filename.replace(chr(92), '/').split('/slimpar/', 1)[-1]}:{f.lineno}"
    first = (str(e).strip().splitlines() or [""])[0][:400]
    return (f"slimpar: internal error{who}: {type(e).__name__}: {first}{where}. This is not a known failure: run "
            "the same command with --debug (or SLIMPAR_DEBUG=1) for the traceback, and report it with the run "
            "folder")
