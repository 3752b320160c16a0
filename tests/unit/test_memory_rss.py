"""The RSS cross-check is reported only where glibc returns freed memory (issue 23: 110 MiB under slimpar's
launcher, 7.8 MiB under torchrun for the same run), and a rank without it does not read as 0 bytes."""

import pytest

from slimpar.train.memory import accounting as memory
from slimpar.train.sinks.metrics import merge_ranks


@pytest.mark.parametrize("value, ok", [(None, False), ("65536", True), ("4096", True), ("131072", False),
                                       ("0", False), ("big", False)])
def test_rss_is_read_only_with_a_small_mmap_threshold(monkeypatch, value, ok):
    if value is None:
        monkeypatch.delenv(memory.RSS_ENV, raising=False)
    else:
        monkeypatch.setenv(memory.RSS_ENV, value)
    assert memory.rss_trustworthy() is ok
    assert (memory.reset_peak_rss() is not None) is ok


def test_merge_keeps_unknown_rss_unknown():
    rank = {"mem": {"params": 8, "peak_rss_delta": None}, "comm_bytes": 0, "wire_bytes": None}
    other = {**rank, "mem": {"params": 4, "peak_rss_delta": None}}
    mem = merge_ranks([rank, other])["mem_breakdown"]
    assert mem == {"params": 8, "peak_rss_delta": None}
    other["mem"]["peak_rss_delta"] = 3
    assert merge_ranks([rank, other])["mem_breakdown"]["peak_rss_delta"] == 3
