"""``python -m slimpar.train.launch.worker_entry CONFIG_JSON OUT_DIR``: one worker of slimpar's own launcher.

The launcher starts each worker as this command, as torchrun starts a script, rather than as a spawned
Python function: a spawned child imports torch (seconds) before any slimpar code runs, so a terminal's
Ctrl-C in those seconds printed the traceback of an interrupted import. Here the first statement installs a
start-up handler that ends the worker with exit 130 and no output (nothing is written before
``worker_main``, which replaces it by the training handler), and only then is torch imported. SIGTERM and SIGUSR1
(the stop signals) get the same start-up handler with exit 143, and the worker asks to die with its launcher
(:mod:`slimpar.train.job.parent`) before anything else. A worker that fails (or stops) exits without the
interpreter's teardown (:func:`slimpar.utils.exit_failed`), so its launcher learns of it at once.
"""

from __future__ import annotations

import os
import signal


def _interrupted_while_starting(signum, frame) -> None:
    os._exit(130 if signum == signal.SIGINT else 143)  # nothing to clean up: no process group, no file written yet


def main(argv: list[str]) -> None:
    import json

    from slimpar.train.launch.worker import worker_main
    from slimpar.utils import exit_failed

    try:
        worker_main(json.loads(argv[1]), argv[2])
    except SystemExit as e:  # a failed or stopped worker: its closing line is out, its files are closed
        if isinstance(e.code, int) and e.code:
            exit_failed(e.code)
        raise  # success, or a message for the interpreter to print


if __name__ == "__main__":
    for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(_sig, _interrupted_while_starting)
    from slimpar.train.job.parent import die_with_parent, launcher_pid

    die_with_parent(launcher_pid())
    import sys

    main(sys.argv)
