"""One job per run folder (train/launch/run_lock.py): a second ``slimpar train`` on a folder that a live job holds stops
with exit 2, the holder's pid and nothing written; the lock dies with its holder, even under ``kill -9``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from slimpar.train.launch.run_lock import LOCK, RunFolderInUse, run_lock
from tests.bad_input import TINY_RUN_ARGS, T, expect_exit_2

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding ``tmp_path/run``'s lock, as a running job does."""
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run / LOCK)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield run, proc
    proc.kill()
    proc.wait()


def test_a_second_job_on_a_held_folder_stops_before_writing(holder, capsys):
    run, proc = holder
    err = expect_exit_2(["train", "--config", T, "--out", str(run), *TINY_RUN_ARGS], run, capsys,
                        ("in use by another slimpar train job", f"pid {proc.pid}", "--out"))
    assert err.count("\n") <= 2  # one message


def test_the_lock_dies_with_its_holder_even_under_kill_9(holder):
    run, proc = holder
    with pytest.raises(RunFolderInUse, match=str(proc.pid)):
        with run_lock(run):
            pass
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with run_lock(run):  # no stale lock: the kernel released it
        assert (run / LOCK).read_text().strip() == str(os.getpid())
        with pytest.raises(RunFolderInUse):  # and this process now holds it against any other opener
            with run_lock(run):
                pass
    with run_lock(run):  # released at the end of the block
        pass
