"""The failed-for-good record: exactly one worker of a restart attempt says it, and a new start clears it all."""

from __future__ import annotations

from slimpar.train.launch import failure


def test_one_worker_per_attempt_says_the_recorded_failure(tmp_path):
    failure.record(tmp_path, "the NaN guard", "training diverged at step 3", 1)
    assert [failure.first_to_say(tmp_path, 1) for _ in range(3)] == [True, False, False]  # three workers, one line
    assert failure.first_to_say(tmp_path, 2)  # the next restart says it again, once
    assert failure.read(tmp_path) == ("the NaN guard", "training diverged at step 3", 1)
    failure.clear(tmp_path)
    assert failure.read(tmp_path) is None and list(tmp_path.iterdir()) == []
    assert failure.first_to_say(tmp_path, 1)  # a new invocation's first restart


def test_an_unwritable_folder_leaves_it_to_rank_0(tmp_path, monkeypatch):
    missing = tmp_path / "gone"
    monkeypatch.setenv("RANK", "1")
    assert not failure.first_to_say(missing, 1)
    monkeypatch.setenv("RANK", "0")
    assert failure.first_to_say(missing, 1)
