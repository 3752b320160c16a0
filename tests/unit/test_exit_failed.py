"""``exit_failed``: a failed process ends at once, yet its threads, ``atexit`` handlers and buffered output finish."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT

SCRIPT = """
import atexit, sys, threading, time
from slimpar.utils import exit_failed
atexit.register(lambda: open(sys.argv[1], "a").write("atexit\\n"))
threading.Thread(target=lambda: (time.sleep(0.3), open(sys.argv[1], "a").write("thread\\n"))).start()
sys.stdout.write("buffered, no newline")  # a pipe: block-buffered, lost by a bare os._exit
exit_failed(3)
print("never")
"""


def test_exit_failed_keeps_the_exit_steps_and_the_code(tmp_path):
    log = tmp_path / "log.txt"
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(log)], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert p.returncode == 3, p.stderr
    assert p.stdout == "buffered, no newline"
    assert log.read_text() == "thread\natexit\n"  # the thread joined first, as the interpreter's own exit does


def test_a_refused_command_exits_with_its_code_and_message(tmp_path):
    p = subprocess.run([sys.executable, "-m", "slimpar", "train", "--config", str(tmp_path / "nope.toml")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2
    assert p.stderr.startswith("slimpar: error: config file") and p.stdout == ""
