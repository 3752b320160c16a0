"""``python -m slimpar``: the command line (slimpar/cli.py)."""

import signal
import sys


def _interrupted_while_starting(signum, frame):
    """Ctrl-C before the command line has its own handler (cli.main installs it): one line, no traceback."""
    print("\nslimpar: interrupted", file=sys.stderr, flush=True)
    raise SystemExit(130)


signal.signal(signal.SIGINT, _interrupted_while_starting)

from slimpar.cli import entry  # noqa: E402

entry()
