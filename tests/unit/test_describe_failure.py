"""The launcher's closing line names the worker that failed first, the root cause, from torch's own failure
records (ChildFailedError of ProcessFailure)."""

import os
import signal

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from slimpar.train.launch.launcher import describe_failure


def _failed(*failures: tuple[int, int, int]) -> ChildFailedError:
    """A ChildFailedError of (rank, exit code, time stamp) records, as the agent builds them (no error file)."""
    records = {}
    for rank, code, stamp in failures:
        f = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code, error_file="/nonexistent/error.json")
        f.timestamp = stamp
        records[rank] = f
    return ChildFailedError("slimpar.train.launch.worker_entry", records)


def test_a_killed_worker_is_named_over_the_survivor_stamped_in_the_same_second():
    # rank 0 exited 1 ("lost a peer") in the second that rank 1 was SIGKILLed: torch's earliest-stamp rule
    # picks rank 0, the lowest key of the tie
    e = _failed((0, 1, 100), (1, -signal.SIGKILL, 100))
    assert e.get_first_failure()[0] == 0
    assert describe_failure(e) == "rank 1 was killed by SIGKILL"


def test_the_agents_sigterm_is_not_the_cause():
    e = _failed((0, 1, 101), (1, -signal.SIGTERM, 100))
    assert describe_failure(e) == "rank 0 exited with code 1"


def test_the_earliest_of_the_same_kind_is_named():
    assert describe_failure(_failed((0, 1, 105), (1, 3, 102), (2, 1, 104))) == "rank 1 exited with code 3"
    assert describe_failure(_failed((0, -signal.SIGTERM, 101), (1, -signal.SIGTERM, 100))) == \
        "rank 1 was killed by SIGTERM"


def test_an_unknown_signal_and_an_empty_record():
    assert describe_failure(_failed((0, -77, 100))) == "rank 0 was killed by signal 77"
    assert describe_failure(RuntimeError("no records")) == "a worker failed"


def test_a_survivor_that_took_the_agents_sigterm_as_a_stop_is_not_the_cause():
    """The agent closes a failed job's survivors with SIGTERM, which a worker takes as a stop request: it exits 143
    (slimpar/train/job/preempt.py). That exit is the agent's doing, not the cause."""
    assert describe_failure(_failed((0, 143, 100), (1, 1, 101))) == "rank 1 exited with code 1"


def test_an_out_of_memory_kill_is_named_from_the_kernel_log_or_the_cgroup_count(monkeypatch):
    from slimpar.train.launch import oom

    e = _failed((0, 143, 100), (1, -signal.SIGKILL, 100), (2, -signal.SIGKILL, 100))
    log = ("[  12.3] python invoked oom-killer: gfp_mask=0x140cca\n"
           "[  12.4] Out of memory: Killed process 1002 (python) total-vm:25000000kB, anon-rss:23000000kB\n")
    killed = oom.sigkilled(e.failures)
    assert killed == {1: 1001, 2: 1002}
    assert oom.oom_killed(killed, count_before=None, log=log) == [2]  # the log names its pid
    monkeypatch.setattr(oom, "oom_kill_count", lambda: 4)
    assert oom.oom_killed(killed, count_before=4, log="") == []  # a SIGKILL from elsewhere: not memory
    assert oom.oom_killed(killed, count_before=3, log="") == [1, 2]  # the count grew: it cannot tell which
    e.oom_ranks = [2]
    assert describe_failure(e) == "rank 2 was killed by the kernel's out-of-memory killer (SIGKILL)"


def test_an_out_of_memory_kill_is_not_restarted(tmp_path, monkeypatch, capsys):
    from slimpar.config import load_config
    from slimpar.train.launch import launcher, oom
    from tests.helpers import TINY

    calls = []

    def agent_run(cfg, out_dir):
        calls.append(cfg.checkpoint.resume)
        raise _failed((0, 143, 100), (1, -signal.SIGKILL, 100))

    monkeypatch.setattr(launcher, "_agent_run", agent_run)
    monkeypatch.setattr(oom, "oom_kill_count", lambda: len(calls))  # one more OOM kill after each start
    monkeypatch.setattr(oom, "_kernel_log", lambda: "")
    cfg = load_config(TINY, ["--parallel.mode", "ddp", "--parallel.workers", "2", "--parallel.max_restarts", "2"])
    environ = dict(os.environ)  # _elastic sets its workers' variables (MALLOC_MMAP_THRESHOLD_, the launcher's pid)
    try:
        launcher._elastic(cfg, tmp_path)
    except ChildFailedError as e:
        assert describe_failure(e) == "rank 1 was killed by the kernel's out-of-memory killer (SIGKILL)"
    else:
        raise AssertionError("the failure was swallowed")
    finally:  # in this test process, where they would reach every later test's subprocesses
        os.environ.clear()
        os.environ.update(environ)
    assert len(calls) == 1  # no restart: the same settings would run out of memory again
    err = capsys.readouterr().err
    assert err.startswith("slimpar: error: rank 1 was killed by the kernel's out-of-memory killer") and \
        "Not restarted" in err and "slimpar plan --memory" in err
