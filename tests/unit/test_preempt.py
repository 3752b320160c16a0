"""Save on preemption (issue 40, slimpar/train/job/preempt.py): the stop request's states, its grace timer, and the
closing line the launcher derives from what ended the job. The runs themselves: tests/distributed/test_preemption.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from types import SimpleNamespace

from slimpar.train.job import preempt
from tests.helpers import ROOT

AGAIN = "slimpar train --out run"


def test_the_grace_timer_imports_nothing_heavy(tmp_path):
    """What the grace timer runs (the record, the newest checkpoint's step) imports no torch: under load an import
    of torch and DCP in the timer's thread took over 10 s, and the grace ran that much past its end (a suite run)."""
    (tmp_path / "checkpoints" / "step_000004").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_000004" / "trainer.json").write_text("{}")
    (tmp_path / "checkpoints" / "step_000008").mkdir()  # no trainer.json: an interrupted save
    script = (f"import sys; from slimpar.train.job.preempt import newest_step; "
              f"print(newest_step({str(tmp_path)!r}), 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.stdout.split() == ["4", "False"], proc.stderr


def test_a_stop_request_raises_before_the_loop_flags_in_it_and_ends_at_its_grace(tmp_path):
    """In a child process (the grace timer ends its process): before ``arm`` SIGTERM raises Preempted; after it the
    handler only notes the signal, which a one-process ``agreed`` returns; past the grace the process exits 143
    and rank 0's record says nothing was saved."""
    script = textwrap.dedent(f"""
        import os, signal, time
        from pathlib import Path
        from slimpar.train.job.preempt import Preempted, StopRequest
        early = StopRequest(60, Path({str(tmp_path)!r}), is_main=True)
        early.install()
        try:
            os.kill(os.getpid(), signal.SIGUSR1)
            print("not raised")
        except Preempted as e:
            print("preempted", e)
        stop = StopRequest(0.5, Path({str(tmp_path)!r}), is_main=True)
        stop.install()
        stop.arm()
        print("agreed before", stop.agreed(None, None))
        os.kill(os.getpid(), signal.SIGTERM)
        print("agreed after", stop.agreed(None, None), flush=True)
        time.sleep(10)
        print("still alive")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.stdout.splitlines() == ["preempted SIGUSR1", "agreed before 0", f"agreed after {int(signal.SIGTERM)}"]
    assert proc.returncode == preempt.EXIT_CODE, proc.stderr
    record = json.loads((tmp_path / preempt.RECORD).read_text())
    assert record["signal"] == "SIGTERM" and record["saved"] is False and record["grace_s"] == 0.5
    # no slimpar launcher is its parent, so the process that ends at the grace says so itself
    assert "stopped by SIGTERM without a checkpoint" in proc.stderr and "on_signal_s = 0.5 s" in proc.stderr


def test_a_burst_of_stop_signals_never_hangs_the_handler(tmp_path):
    """Stop signals that arrive while the handler runs re-enter it in the main thread (SLURM's signal to every
    process plus the launcher's copy; a killed launcher's death signal): the main thread must come back from it.
    A handler that started the grace timer under a lock deadlocked inside itself within a few bursts (its rank then
    hung in the step until the grace ended it without a checkpoint: tests/distributed/test_preemption.py, 1 run in
    30 under load). Here 100 bursts of 300 SIGTERMs each, each on a fresh request, must all reach the step boundary
    before the 20 s grace (which ends a hung child, and the test with it)."""
    child = textwrap.dedent(f"""
        import signal, sys
        from pathlib import Path
        from slimpar.train.job.preempt import StopRequest
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what uninstall restores: a late signal of a burst is lost
        for t in range(100):
            stop = StopRequest(20, Path({str(tmp_path)!r}), is_main=False)
            stop.arm()  # first: a late signal of the last burst must not end the child (Preempted) as it installs
            stop.install()
            print("ready", flush=True)
            sys.stdin.readline()  # the burst is over
            print("agreed", stop.agreed(None, None), flush=True)
            stop.uninstall()
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin",
                                                                           "PYTHONPATH": str(ROOT)})
    said = []
    try:
        for _ in range(100):
            said.append(proc.stdout.readline().strip())
            for _ in range(300):
                os.kill(proc.pid, signal.SIGTERM)
            proc.stdin.write("\n")
            proc.stdin.flush()
            said.append(proc.stdout.readline().strip())
    except BrokenPipeError:  # the child ended early: its exit code and stderr say why
        pass
    finally:
        _, err = proc.communicate(timeout=60)
    assert said == ["ready", f"agreed {int(signal.SIGTERM)}"] * 100 and proc.returncode == 0, \
        (said, proc.returncode, err[-3000:])


def _failure(code: int) -> SimpleNamespace:
    return SimpleNamespace(exitcode=code, pid=1, timestamp=0)


def test_the_closing_line_tells_a_stop_from_a_failure(tmp_path):
    assert preempt.closing_line(KeyboardInterrupt(), tmp_path, AGAIN) is None
    line = preempt.closing_line(preempt.Preempted(signal.SIGTERM), tmp_path, AGAIN)
    assert line.startswith("slimpar: stopped by SIGTERM before its first step: nothing to save") and AGAIN in line
    agent = SimpleNamespace(sigval=signal.SIGUSR1)  # the elastic agent's SignalException, no record yet
    assert "stopped by SIGUSR1 without a checkpoint" in preempt.closing_line(agent, tmp_path, AGAIN)
    workers_only = SimpleNamespace(failures={0: _failure(143), 1: _failure(143)})  # ChildFailedError
    assert preempt.closing_line(workers_only, tmp_path, AGAIN) is None  # no record: not known to be a stop
    preempt.write_record(tmp_path, {"signal": "SIGTERM", "saved": True, "step": 7, "checkpoint": "run/ck/7"})
    line = preempt.closing_line(workers_only, tmp_path, AGAIN)
    assert line == (f"slimpar: stopped by SIGTERM: every rank finished step 7 and saved its checkpoint (run/ck/7); "
                    f"the run folder is {tmp_path}; to resume it: {AGAIN}")
    # a worker that died otherwise makes it a failure, whatever the survivors did with the agent's SIGTERM
    lost = SimpleNamespace(failures={0: _failure(143), 1: _failure(-signal.SIGKILL)})
    assert preempt.closing_line(lost, tmp_path, AGAIN) is None
    assert preempt.closing_line(SystemExit(preempt.EXIT_CODE), tmp_path, AGAIN) == line
    assert preempt.closing_line(SystemExit(1), tmp_path, AGAIN) is None
