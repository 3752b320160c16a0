"""Real throttled links between network namespaces (``benchmarks.network.links``), and the send-side model.

These tests create namespaces, a bridge and veth pairs, so they need root and iproute2 (CI runs as root on the
same kind of machine). All traffic stays on 10.123.0.0/24 inside the namespaces the tests create; every network
is torn down on exit, which the tests check with ``ip netns list``.
"""

from __future__ import annotations

import subprocess

import pytest

from benchmarks.network import links
from benchmarks.network.links import (
    ThrottledNetwork,
    list_namespaces,
    run_in_network,
    simulated_step_time,
    tbf_params,
)
from benchmarks.network.tcp_probe import measure_tcp_throughput
from tests.helpers import TINY

RATE = 20.0  # Mbit/s: a 5 MiB transfer takes ~2 s
DDP = ["--parallel.mode", "ddp", "--train.steps", "5", "--data.ood", "none", "--eval.batches", "1"]


def ours(prefix: str) -> list[str]:
    return [n for n in list_namespaces() if n.startswith(f"{prefix}-")]


def netns_pids(ns: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout.split()


# ------------------------------------------------------------------------------------------ the model
def test_simulated_step_time_matches_hand_computation():
    # 0.1 s compute + 1e6 B * 8 / 100e6 bit/s = 0.08 s on the wire + 3 messages * 20 ms
    assert simulated_step_time(0.1, 1_000_000, 100.0, 0.02, 3) == pytest.approx(0.24)
    assert simulated_step_time(0.1, 1_000_000, None, 0.02, 3) == pytest.approx(0.16)  # unlimited bandwidth
    assert simulated_step_time(0.5, 125_000_000, 1000.0, 0.0, 0) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        simulated_step_time(0.1, -1, 100.0, 0.02, 3)
    with pytest.raises(ValueError):
        simulated_step_time(0.1, 1, 0.0, 0.02, 3)


def test_tbf_parameters_scale_with_rate():
    low, high = tbf_params(20.0), tbf_params(1000.0)
    assert (low.rate_kbit, low.burst_bytes, low.latency_ms) == (20_000, 65_536, 100)
    assert (high.rate_kbit, high.burst_bytes) == (1_000_000, 1_250_000)  # 10 ms at line rate
    assert high.tc_args() == ["tbf", "rate", "1000000kbit", "burst", "1250000", "latency", "100ms"]


def test_refuses_clearly_without_root_or_ip(monkeypatch):
    monkeypatch.setattr(links.os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match="root"), ThrottledNetwork(2, None, prefix="splnr"):
        pass
    monkeypatch.undo()
    monkeypatch.setattr(links.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="'ip'"), ThrottledNetwork(2, None, prefix="splnr"):
        pass
    assert ours("splnr") == []


# ---------------------------------------------------------------------------------- namespaces
def test_set_up_is_idempotent_and_tear_down_complete():
    prefix = "spllife"
    subprocess.run(["ip", "netns", "add", f"{prefix}-h7"], check=True, timeout=30)  # a stale leftover
    subprocess.run(["ip", "netns", "add", f"{prefix}-keep"], check=True, timeout=30)  # not one of ours
    try:
        with ThrottledNetwork(3, RATE, prefix=prefix) as net:
            assert sorted(ours(prefix)) == [f"{prefix}-h0", f"{prefix}-h1", f"{prefix}-h2", f"{prefix}-keep",
                                            f"{prefix}-sw"]
            assert net.host_ip(2) == "10.123.0.3" and net.ifname(2) == f"{prefix}h2"
            assert net.exec_prefix(1) == ["ip", "netns", "exec", f"{prefix}-h1"]
            assert all("rate 20Mbit" in q for q in net.qdiscs(0)) and len(net.qdiscs(0)) == 2
            with pytest.raises(RuntimeError, match="another"), ThrottledNetwork(1, None, prefix=prefix):
                pass
            assert len(ours(prefix)) == 5  # the refused second network touched nothing
        assert ours(prefix) == [f"{prefix}-keep"]
        with pytest.raises(ZeroDivisionError), ThrottledNetwork(2, None, prefix=prefix):
            _ = 1 / 0
        assert ours(prefix) == [f"{prefix}-keep"]  # torn down on errors too
    finally:
        subprocess.run(["ip", "netns", "del", f"{prefix}-keep"], timeout=30)
        subprocess.run(["ip", "netns", "del", f"{prefix}-h7"], capture_output=True, timeout=30)
    assert ours(prefix) == []


def test_raw_tcp_throughput_follows_the_rate_limit():
    with ThrottledNetwork(2, RATE, prefix="spltcp") as net:
        there = measure_tcp_throughput(net, 0, 1, 5 * 2**20)
        back = measure_tcp_throughput(net, 1, 0, 5 * 2**20)  # the other direction is limited as well
    with ThrottledNetwork(2, None, prefix="spltcp") as net:
        free = measure_tcp_throughput(net, 0, 1, 5 * 2**20)
    assert ours("spltcp") == []
    for r in (there, back):
        assert r["bytes"] == 5 * 2**20
        assert 0.75 * RATE <= r["mbit_s"] <= 1.25 * RATE, r
    assert free["mbit_s"] > 5 * RATE, free


# ------------------------------------------------------------------------------------- training
def test_ddp_training_runs_over_the_throttled_links(tmp_path):
    with ThrottledNetwork(2, RATE, prefix="splddp") as net:
        s = run_in_network(net, TINY, tmp_path / "ddp", DDP, world=2, timeout_s=240)
    assert ours("splddp") == []
    tx, rx = s["links"]["veth_tx_bytes"], s["links"]["veth_rx_bytes"]
    assert s["world_size"] == 2 and s["steps"] == 5
    for rank, r in enumerate(s["per_rank"]):
        # every step all-reduces the same gradients: the link carried at least steps x the measured step's bytes
        assert r["wire_bytes"] >= r["comm_bytes"] > 0
        assert tx[rank] >= s["steps"] * r["wire_bytes"], (rank, tx, r["wire_bytes"])
    # two hosts on one bridge: what one sent is what the other received (up to a few ARP / IPv6 packets)
    assert rx[1] == pytest.approx(tx[0], rel=0.01) and rx[0] == pytest.approx(tx[1], rel=0.01)
    # the limit is a hard floor: a step cannot be faster than its bytes at 20 Mbit/s
    assert s["step_time_s"] >= 0.9 * s["wire_bytes_per_step"] * 8 / (RATE * 1e6)
    assert (tmp_path / "ddp" / "links.json").exists() and s["links"]["latency_applied"] is False


def test_worker_failure_and_timeout_kill_the_set(tmp_path):
    with ThrottledNetwork(2, None, prefix="splfail") as net:
        with pytest.raises(RuntimeError, match=r"(?s)worker \d exited.*unknown config key 'nosuch'"):
            run_in_network(net, TINY, tmp_path / "bad", ["--nosuch.key", "1"], world=2, timeout_s=120)
        with pytest.raises(RuntimeError, match="timed out after 1 s"):
            run_in_network(net, TINY, tmp_path / "slow", DDP, world=2, timeout_s=1)
        assert netns_pids(net.namespace(0)) == [] and netns_pids(net.namespace(1)) == []
    assert ours("splfail") == []
