"""Two real "nodes" on this machine (``benchmarks.network.nodes``): two network namespaces on one veth pair, one
``torchrun --nnodes 2 --nproc_per_node 2 --rdzv_backend c10d`` per namespace, gloo bound to the veth.

Both nodes share this machine's file system (like a cluster with a shared file system), so ``--out`` is one
folder. The training runs must end with exactly the per-step losses and validation loss of the same run with
4 local workers on one host (``slimpar train``): same ranks, same data, same gloo algorithms, one thread per
worker in both. Traffic stays on 10.77.0.0/24 inside the namespaces the tests create; every namespace is
removed on exit, which the tests check.
"""

from __future__ import annotations

import os

import pytest

from benchmarks.network.links import list_namespaces
from benchmarks.network.nodes import TwoNodes, run_two_nodes, torchrun_command
from benchmarks.network.tcp_probe import measure_tcp_throughput
from tests.helpers import TINY, losses, run_train, summary

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CAP_SYS_ADMIN)")

SHORT = ["--train.steps", "6", "--log.progress", "false", "--checkpoint.export", "false", "--data.ood", "none"]
MODES = {
    "sdp": ["--parallel.mode", "sdp", "--parallel.workers", "4"],
    "pipeline-mapl": ["--parallel.mode", "pipeline", "--pipeline.stages", "4", "--pipeline.codec", "mapl",
                      "--model.tie_embeddings", "false", "--parallel.workers", "4"],
}


def ours(prefix: str) -> list[str]:
    return [n for n in list_namespaces() if n.startswith(f"{prefix}-")]


def test_two_namespaces_on_one_rate_limited_veth_pair():
    with TwoNodes(rate_mbit=20.0, prefix="spntcp") as nodes:
        assert sorted(ours("spntcp")) == ["spntcp-n0", "spntcp-n1"]
        assert (nodes.host_ip(0), nodes.host_ip(1)) == ("10.77.0.1", "10.77.0.2")
        assert all("rate 20Mbit" in q for k in (0, 1) for q in nodes.qdiscs(k))
        there = measure_tcp_throughput(nodes, 0, 1, 2 * 2**20)
        back = measure_tcp_throughput(nodes, 1, 0, 2 * 2**20)  # both ends carry the limit
        cmd = torchrun_command(nodes, 1, 29500, "job", ["--out", "/shared/run"])
    assert ours("spntcp") == []
    for r in (there, back):
        assert 0.75 * 20 <= r["mbit_s"] <= 1.25 * 20, r
    joined = " ".join(cmd)
    assert "--nnodes 2 --nproc_per_node 2 --node_rank 1 --rdzv_backend c10d --rdzv_endpoint 10.77.0.1:29500" in joined
    assert joined.endswith("-m slimpar train --out /shared/run")


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_two_node_torchrun_matches_one_host_bitwise(tmp_path, mode):
    with TwoNodes(prefix="spnrun") as nodes:
        two = run_two_nodes(nodes, TINY, tmp_path / "two", [*MODES[mode], *SHORT], timeout_s=400)
    assert ours("spnrun") == []
    run_train(tmp_path / "one", *MODES[mode], *SHORT, timeout=400)
    one = summary(tmp_path / "one")
    assert two["world_size"] == one["world_size"] == 4 and two["steps"] == 6
    # the job really crossed the inter-node link, both ways
    assert min(two["links"]["veth_tx_bytes"]) > 100_000, two["links"]
    assert losses(tmp_path / "two") == losses(tmp_path / "one")  # bitwise: same floats in metrics.jsonl
    assert two["val_loss"] == one["val_loss"]
