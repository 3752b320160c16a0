"""``write_text_atomic``: a reader never sees a truncated file (a restarted torchrun rank once compared the run's
``config.toml`` while rank 0 rewrote it, read an empty file as the default config and refused to resume)."""

from __future__ import annotations

import threading

import pytest

from slimpar.utils import write_text_atomic


def test_a_concurrent_reader_sees_the_old_or_the_new_file_never_a_partial_one(tmp_path):
    path = tmp_path / "config.toml"
    texts = ["a = 1\n" * 5000, "b = 2\n" * 5000]
    write_text_atomic(path, texts[0])
    seen, stop = set(), threading.Event()

    def read():
        while not stop.is_set():
            seen.add(path.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(300):
        write_text_atomic(path, texts[i % 2])
    stop.set()
    reader.join()
    assert seen <= set(texts) and len(seen) >= 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "taken"
    (path / "inside").mkdir(parents=True)  # the rename onto a non-empty folder fails, as a full disk would
    with pytest.raises(OSError):
        write_text_atomic(path, "new\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"] and (path / "inside").is_dir()
