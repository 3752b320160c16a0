"""The launcher's closing line names the worker that failed first, the root cause, from torch's own failure
records (ChildFailedError of ProcessFailure)."""

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
