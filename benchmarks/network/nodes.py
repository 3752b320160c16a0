"""Two real "nodes" on one machine: two network namespaces joined by one veth pair, one torchrun per node.

``TwoNodes`` builds namespaces ``{prefix}-n0`` and ``{prefix}-n1`` joined directly by a veth pair
(``{prefix}v0`` in node 0 with 10.77.0.1/24, ``{prefix}v1`` in node 1 with 10.77.0.2/24), each with its own
loopback up. With ``rate_mbit`` both ends of the pair get the same ``tbf`` limit as
:class:`~benchmarks.network.links.ThrottledNetwork`'s links, so the inter-node link is limited in both directions,
while the workers of one node talk over its loopback, unthrottled: the layout of a small cluster with a
fast intra-node and a slow inter-node network. Latency is not added (no netem here: ``LATENCY_NOTE``).

``run_two_nodes`` then starts in each namespace what an operator types on each host of a real cluster::

    python -m torch.distributed.run --nnodes 2 --nproc_per_node 2 --node_rank k --rdzv_backend c10d \\
        --rdzv_endpoint 10.77.0.1:PORT --rdzv_id ID -m slimpar train --config ... --out SHARED_DIR ...

with ``GLOO_SOCKET_IFNAME`` = the node's veth so that gloo binds the inter-node interface. Both namespaces
share this machine's file system, like a cluster with a shared file system, so ``--out`` is one folder.
Two additions are needed only because both "nodes" share one hostname (there is no UTS namespace):
``--rdzv_conf is_host=1|0`` tells node 0's agent to host the rendezvous store (on real hosts torchrun finds
that out by matching the endpoint against its own hostname) and ``--local_addr`` gives each agent its
address instead of the shared hostname.

``run_elastic_two_nodes`` runs the elastic form (``--nnodes 1:2 --max-restarts K``, short rendezvous timeouts
``ELASTIC_RDZV``) and takes node 1 away mid-run with :func:`kill_node` (every process of its namespace gets
SIGKILL), optionally after letting it join a job node 0 started alone (docs/multinode.md, "Elastic runs").
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import slimpar
from benchmarks.network.links import LATENCY_NOTE, ThrottledNetwork, _kill, _run, _wait_all, free_port

SUBNET = "10.77.0"  # private range, only ever configured inside the two namespaces this module creates
# torchrun-, elastic- and process-group variables of an enclosing job must not leak into the nodes' agents
_JOB_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
             "MASTER_PORT", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class TwoNodes(ThrottledNetwork):
    """Two namespaces ("nodes") on one veth pair, optionally rate-limited with ``tbf`` on both ends.

    A context manager like :class:`ThrottledNetwork` (the same lock file per prefix, stale namespaces of
    this prefix removed on entry, everything removed on exit, also on errors); needs root and ``ip``
    (and ``tc`` with a rate). ``namespace(k)``, ``ifname(k)``, ``host_ip(k)`` and ``exec_prefix(k)`` name
    node ``k``'s pieces; ``link_stats(k)`` reads its veth's counters.
    """

    def __init__(self, rate_mbit: float | None = None, prefix: str = "spn") -> None:
        super().__init__(2, rate_mbit, prefix)

    def namespace(self, i: int) -> str:
        return f"{self.prefix}-n{self._check(i)}"

    def ifname(self, i: int) -> str:
        return f"{self.prefix}v{self._check(i)}"

    def host_ip(self, i: int) -> str:
        return f"{SUBNET}.{self._check(i) + 1}"

    def _ours(self) -> re.Pattern[str]:
        return re.compile(rf"^{re.escape(self.prefix)}-n[01]$")

    def _build(self) -> None:
        for k in (0, 1):
            _run(["ip", "netns", "add", self.namespace(k)])
            _run(["ip", "-n", self.namespace(k), "link", "set", "lo", "up"])
        # created in node 0 with the peer moved straight into node 1: nothing appears in the machine's namespace
        _run(["ip", "-n", self.namespace(0), "link", "add", self.ifname(0), "type", "veth", "peer", "name",
              self.ifname(1), "netns", self.namespace(1)])
        for k in (0, 1):
            ns, dev = self.namespace(k), self.ifname(k)
            _run(["ip", "-n", ns, "addr", "add", f"{self.host_ip(k)}/24", "dev", dev])
            _run(["ip", "-n", ns, "link", "set", dev, "up"])
            if self.tbf is not None:
                _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *self.tbf.tc_args()])

    def qdiscs(self, i: int) -> list[str]:
        out = _run(["tc", "-n", self.namespace(i), "qdisc", "show", "dev", self.ifname(i)]).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def netem_available(self) -> bool:
        probe = ["tc", "-n", self.namespace(0), "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]
        if _run(probe, check=False).returncode != 0:
            return False
        _run(["tc", "-n", self.namespace(0), "qdisc", "del", "dev", "lo", "root"], check=False)
        return True


def torchrun_command(nodes: TwoNodes, k: int, port: int, rdzv_id: str, train_args: list[str],
                     nproc_per_node: int = 2, nnodes: str = "2", max_restarts: int = 0,
                     rdzv_conf: dict[str, int] | None = None) -> list[str]:
    """The command node ``k`` runs (without the ``ip netns exec`` prefix): torchrun, then ``slimpar train``.

    ``nnodes`` ``"MIN:MAX"`` (e.g. ``"1:2"``) with ``max_restarts`` > 0 is an elastic job (``ELASTIC_RDZV``);
    an elastic node joins without ``--node_rank`` (the rendezvous assigns node ranks)."""
    conf = ",".join(f"{key}={v}" for key, v in {"is_host": int(k == 0), **(rdzv_conf or {})}.items())
    rank = [] if ":" in nnodes else ["--node_rank", str(k)]
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", nnodes, "--nproc_per_node", str(nproc_per_node),
            *rank, "--rdzv_backend", "c10d", "--rdzv_endpoint", f"{nodes.host_ip(0)}:{port}",
            "--rdzv_id", rdzv_id, "--rdzv_conf", conf, "--local_addr", nodes.host_ip(k),
            "--max_restarts", str(max_restarts), "--monitor_interval", "0.2", "-m", "slimpar", "train", *train_args]


# c10d rendezvous settings of the elastic tests: a dead node's heartbeat expires after 2 x 3 s, a round closes
# 4 s after its minimum of nodes has joined, and a restarted agent waits at most 120 s for that minimum
ELASTIC_RDZV = {"join_timeout": 120, "last_call_timeout": 4, "keep_alive_interval": 2, "keep_alive_max_attempt": 3}
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # see node_env


def node_env(nodes: TwoNodes, k: int, elastic: bool = False) -> dict[str, str]:
    """Node ``k``'s environment: gloo bound to its veth, one thread per worker, slimpar importable.

    ``elastic``: also ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (``ELASTIC_ENV``). With the agents' shared store
    (torch's default) a node that joins a running job waits forever for ``MASTER_ADDR`` of the new round:
    rank 0, which built its store info in an earlier round, does not write it again (torch 2.13,
    ``DynamicRendezvousHandler.next_rendezvous``). Without sharing, rank 0 publishes a fresh address each round
    and the workers' rank 0 hosts their store."""
    env = {key: v for key, v in os.environ.items() if not key.startswith("TORCHELASTIC_") and key not in _JOB_VARS}
    pkg_root = str(Path(slimpar.__file__).resolve().parents[1])
    env.update(GLOO_SOCKET_IFNAME=nodes.ifname(k), OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536",
               PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join(p for p in (pkg_root, os.environ.get("PYTHONPATH", "")) if p))
    return {**env, **(ELASTIC_ENV if elastic else {})}


def node_commands(nodes: TwoNodes, config: str | Path, out: Path, overrides: list[str], nproc_per_node: int = 2,
                  **torchrun: Any) -> list[list[str]]:
    """Both nodes' commands for one job (a fresh port and rendezvous id); ``torchrun``: :func:`torchrun_command`'s
    elastic keywords."""
    port, rdzv_id = free_port(nodes, 0), f"slimpar-{uuid.uuid4().hex[:8]}"
    train = ["--config", str(Path(config).resolve()), "--out", str(out), *overrides]
    return [torchrun_command(nodes, k, port, rdzv_id, train, nproc_per_node, **torchrun) for k in (0, 1)]


def start_node(nodes: TwoNodes, k: int, cmd: list[str], out: Path, elastic: bool = False) -> subprocess.Popen:
    """Start node ``k``'s agent in its namespace and in a session of its own (torchrun starts each worker in
    another), with :func:`node_env`; its output goes to ``out/nodes/node{k}.{out,err}``."""
    logs = out / "nodes"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"node{k}.out", "w") as so, open(logs / f"node{k}.err", "w") as se:
        return subprocess.Popen([*nodes.exec_prefix(k), *cmd], stdout=so, stderr=se, env=node_env(nodes, k, elastic),
                                start_new_session=True)


def start_two_nodes(nodes: TwoNodes, config: str | Path, out: Path, overrides: list[str], nproc_per_node: int = 2,
                    **torchrun: Any) -> tuple[list[subprocess.Popen], list[list[str]]]:
    """Start one torchrun per node (node 1 first: it waits for node 0's store); returns the agents and commands."""
    cmds = node_commands(nodes, config, out, overrides, nproc_per_node, **torchrun)
    procs: dict[int, subprocess.Popen] = {}
    try:
        for k in (1, 0):
            procs[k] = start_node(nodes, k, cmds[k], out)
    except BaseException:
        _kill(list(procs.values()))
        raise
    return [procs[0], procs[1]], cmds


def kill_node(nodes: TwoNodes, k: int) -> list[int]:
    """SIGKILL every process in node ``k``'s namespace (its agent and the workers, which torchrun starts in
    sessions of their own): the node is gone at once, as after a power cut. Returns the pids killed."""
    pids = [int(p) for p in _run(["ip", "netns", "pids", nodes.namespace(k)]).stdout.split()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def run_two_nodes(nodes: TwoNodes, config: str | Path, out: str | Path, overrides: list[str],
                  nproc_per_node: int = 2, timeout_s: float = 600.0) -> dict[str, Any]:
    """Train with one torchrun per node (``2 * nproc_per_node`` workers) and return rank 0's summary.

    ``out`` is the one shared run folder (both nodes see this machine's file system). Each node's
    torchrun output goes to ``out/nodes/node{k}.{out,err}``. A failing node or the ``timeout_s`` deadline
    kills both process trees and raises ``RuntimeError`` with that node's stderr. The summary gains
    ``links``: the inter-node veth byte counters over the run (``veth_tx_bytes[k]`` = bytes node ``k``
    put on the link, headers included), the rate and qdiscs, the wall-clock time, the two commands and
    ``LATENCY_NOTE``; the same is written to ``out/links.json``.
    """
    out = Path(out).resolve()
    before = [nodes.link_stats(k) for k in (0, 1)]
    t0 = time.perf_counter()
    procs, cmds = start_two_nodes(nodes, config, out, overrides, nproc_per_node)
    _wait_all(procs, out / "nodes", timeout_s, name="node", stem="node")
    wall = time.perf_counter() - t0
    after = [nodes.link_stats(k) for k in (0, 1)]
    links = {
        "rate_mbit": nodes.rate_mbit, "nodes": 2, "nproc_per_node": nproc_per_node, "wall_s": wall,
        "veth_tx_bytes": [a["tx_bytes"] - b["tx_bytes"] for a, b in zip(after, before, strict=True)],
        "veth_rx_bytes": [a["rx_bytes"] - b["rx_bytes"] for a, b in zip(after, before, strict=True)],
        "qdiscs": [nodes.qdiscs(k) for k in (0, 1)], "latency_applied": False, "note": LATENCY_NOTE,
        "commands": [" ".join([*nodes.exec_prefix(k), *cmds[k]]) for k in (0, 1)],
    }
    (out / "links.json").write_text(json.dumps(links, indent=1))
    summary = json.loads((out / "summary.json").read_text())
    return {**summary, "links": links}


def _wait_for_checkpoint(out: Path, after: int, procs: list[subprocess.Popen], deadline: float) -> str:
    """Poll until the newest complete checkpoint in ``out`` is past step ``after``; returns its folder name.
    Raises RuntimeError when an agent ended first or at ``deadline`` (``time.monotonic``)."""
    from slimpar.train.checkpoint.folders import latest_checkpoint

    while (ckpt := latest_checkpoint(out)) is None or int(ckpt.name.split("_")[-1]) <= after:
        codes = [p.poll() for p in procs]
        if any(c is not None for c in codes) or time.monotonic() > deadline:
            raise RuntimeError(f"no checkpoint after step {after} before an agent ended ({codes}) or the deadline; "
                               f"node 0 stderr:\n{(out / 'nodes' / 'node0.err').read_text()[-4000:]}")
        time.sleep(0.05)
    return ckpt.name


def _joined_at(out: Path, procs: list[subprocess.Popen], deadline: float) -> int:
    """Poll ``OUT/membership.json`` until a start with 2 nodes' workers is recorded; returns its step."""
    from slimpar.train.job.elastic import MEMBERSHIP

    while True:
        try:
            attempts = json.loads((out / MEMBERSHIP).read_text())["attempts"]
            bigger = [a["step"] for a in attempts[1:] if a["world"] > attempts[0]["world"]]
            if bigger:
                return bigger[0]
        except (OSError, ValueError, KeyError):
            pass
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise RuntimeError("node 1 did not join before an agent ended or the deadline; node 1 stderr:\n"
                               f"{(out / 'nodes' / 'node1.err').read_text()[-4000:]}")
        time.sleep(0.05)


def run_elastic_two_nodes(nodes: TwoNodes, config: str | Path, out: str | Path, overrides: list[str],
                          kill_after: int, join_after: int | None = None, max_restarts: int = 1,
                          nproc_per_node: int = 2, timeout_s: float = 600.0) -> dict[str, Any]:
    """An elastic job (``--nnodes 1:2``) on both nodes, node 1 killed once checkpoint ``kill_after`` exists.

    Both agents run with ``ELASTIC_RDZV`` and ``--max-restarts max_restarts``. With ``join_after``, node 0
    starts alone and node 1 only once checkpoint ``join_after`` exists: node 0's agent sees a node waiting,
    restarts its workers (not counted as a restart) and the job re-forms on both nodes; the kill then waits
    for a checkpoint that job wrote. As soon as the newest complete checkpoint is at step ``kill_after`` or
    later, :func:`kill_node` ends node 1; node 0's workers fail on their next collective, its agent restarts
    them (one restart) in a new rendezvous round of node 0 alone, and they resume from the newest checkpoint
    with ``nproc_per_node`` workers. Returns rank 0's summary with ``elastic``: the newest checkpoint at the
    kill, the pids killed, the wall time and the two commands (also in ``out/elastic.json``).
    """
    out = Path(out).resolve()
    t0, deadline = time.perf_counter(), time.monotonic() + timeout_s
    cmds = node_commands(nodes, config, out, overrides, nproc_per_node, nnodes="1:2", max_restarts=max_restarts,
                         rdzv_conf=ELASTIC_RDZV)
    procs: list[subprocess.Popen] = []
    try:
        if join_after is None:
            procs = [start_node(nodes, 1, cmds[1], out, True)]
            procs.insert(0, start_node(nodes, 0, cmds[0], out, True))
            ckpt = _wait_for_checkpoint(out, kill_after - 1, procs, deadline)
        else:  # node 0 alone first; node 1 joins once checkpoint join_after exists
            procs = [start_node(nodes, 0, cmds[0], out, True)]
            _wait_for_checkpoint(out, join_after - 1, procs, deadline)
            procs.append(start_node(nodes, 1, cmds[1], out, True))
            joined = _joined_at(out, procs, deadline)
            ckpt = _wait_for_checkpoint(out, max(joined, kill_after - 1), procs, deadline)
        killed = kill_node(nodes, 1)
        procs[1].wait(timeout=30)
    except BaseException:
        _kill(procs)
        raise
    _wait_all(procs[:1], out / "nodes", max(deadline - time.monotonic(), 1.0), name="node", stem="node")
    elastic = {"checkpoint_at_kill": ckpt, "killed_pids": len(killed), "wall_s": time.perf_counter() - t0,
               "commands": [" ".join([*nodes.exec_prefix(k), *cmds[k]]) for k in (0, 1)]}
    (out / "elastic.json").write_text(json.dumps(elastic, indent=1))
    return {**json.loads((out / "summary.json").read_text()), "elastic": elastic}
