"""Real throttled links between local "hosts", and the send-side model used where they are not available.

``ThrottledNetwork`` builds a star of Linux network namespaces: one switch namespace holding a bridge,
and one namespace per host joined to that bridge by a veth pair. Host ``i`` has the address
``10.123.0.(i+1)/24`` on its veth; nothing is added to the machine's own namespace, so traffic between
hosts stays on those namespaces' own addresses. With ``rate_mbit`` each veth pair gets a ``tbf`` rate
limit on both ends (host-side egress: host -> switch; bridge-side egress: switch -> host), so every
host's link is limited in both directions. Added latency is *not* applied: ``netem`` is not available
in this kernel (``tc`` answers "Specified qdisc kind is unknown"; see ``ThrottledNetwork.netem_available``),
so the benchmark adds latency only in ``simulated_step_time`` and says so (``LATENCY_NOTE``).

``run_in_network`` runs one ``slimpar train`` worker per host namespace (torchrun-style environment,
gloo bound to the host's veth) and reads the veths' byte counters before and after, which shows that
the job's traffic really crossed the throttled links.

Creating namespaces needs root and the ``ip`` (and, for rate limits, ``tc``) tools; without them the
constructor's ``__enter__`` raises ``RuntimeError`` naming what is missing.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import slimpar

SUBNET = "10.123.0"  # private range, only ever configured inside namespaces this module creates
CMD_TIMEOUT_S = 30.0  # every ``ip`` / ``tc`` call is bounded
LATENCY_NOTE = ("Latency is not applied on the real links: netem is unavailable in this kernel, so the real "
                "throttled runs measure bandwidth limits only; the send-side simulator adds the latency.")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")  # short: interface names are limited to 15 characters


@dataclass(frozen=True)
class TbfParams:
    """Token-bucket parameters for one rate limit.

    ``burst_bytes`` is the bucket size: the most that may leave back to back at line rate. It is at least
    64 KiB so that one whole GSO/TSO super-packet (veths hand TCP segments of up to 64 KiB to the qdisc)
    fits in the bucket, and at least 10 ms worth of the rate so that timer granularity does not cap high
    rates (1 Gbit/s -> 1.25 MB). ``latency_ms`` bounds the queue: packets that would wait longer than
    100 ms are dropped, which is far above the round-trip time between namespaces, so TCP can keep the
    link full (env.md measured 95.8 Mbit/s with these settings at 100 Mbit/s).
    """

    rate_kbit: int
    burst_bytes: int
    latency_ms: int

    def tc_args(self) -> list[str]:
        return ["tbf", "rate", f"{self.rate_kbit}kbit", "burst", str(self.burst_bytes), "latency",
                f"{self.latency_ms}ms"]


def tbf_params(rate_mbit: float) -> TbfParams:
    """The ``tbf`` settings used for ``rate_mbit`` (10^6 bits per second); see ``TbfParams``."""
    if rate_mbit <= 0:
        raise ValueError(f"rate_mbit must be positive, got {rate_mbit}")
    bytes_per_s = rate_mbit * 1e6 / 8
    return TbfParams(rate_kbit=max(1, round(rate_mbit * 1000)), burst_bytes=max(64 * 1024, int(bytes_per_s * 0.01)),
                     latency_ms=100)


def simulated_step_time(compute_s: float, bytes_per_step: float, rate_mbit: float | None, latency_s: float,
                        messages_per_step: int) -> float:
    """Send-side model of one step's wall-clock time on a slow link.

    Returns ``compute_s + bytes_per_step * 8 / (rate_mbit * 1e6) + latency_s * messages_per_step``.

    Assumes: ``bytes_per_step`` are the bytes one worker sends per step and its own link (full duplex,
    ``rate_mbit`` in 10^6 bit/s each way, star topology with a non-blocking switch) is the only bottleneck;
    communication does not overlap computation; the messages are sequential, each paying one one-way
    ``latency_s`` with nothing pipelined; protocol overhead (headers, acknowledgements, TCP slow start) is
    ignored. ``rate_mbit=None`` means unlimited bandwidth (only latency is added). ``compute_s`` is
    normally the step time measured on an unthrottled run, which already contains local copy costs.
    """
    if compute_s < 0 or bytes_per_step < 0 or latency_s < 0 or messages_per_step < 0:
        raise ValueError("compute_s, bytes_per_step, latency_s and messages_per_step must be non-negative")
    if rate_mbit is not None and rate_mbit <= 0:
        raise ValueError(f"rate_mbit must be positive or None, got {rate_mbit}")
    transfer = 0.0 if rate_mbit is None else bytes_per_step * 8 / (rate_mbit * 1e6)
    return compute_s + transfer + latency_s * messages_per_step


# --------------------------------------------------------------------------------------------- commands
def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run one set-up / tear-down command with a hard timeout; raise with its stderr on failure."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _require(tools: list[str]) -> None:
    """Raise ``RuntimeError`` naming the reason when namespaces cannot be created here."""
    if os.geteuid() != 0:
        raise RuntimeError("ThrottledNetwork needs root: creating network namespaces requires CAP_SYS_ADMIN "
                           f"(running as uid {os.geteuid()})")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise RuntimeError(f"ThrottledNetwork needs the iproute2 tools {missing} on PATH")


def list_namespaces() -> list[str]:
    """Names of the machine's named network namespaces (``ip netns list``)."""
    out = _run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


class ThrottledNetwork:
    """A bridge in a switch namespace and ``n_hosts`` host namespaces, each on its own (optionally
    rate-limited) veth link. Use as a context manager; everything is removed on exit, also on errors.

    Names: namespaces ``{prefix}-sw`` and ``{prefix}-h{i}``; veth ``{prefix}h{i}`` (host side) and
    ``{prefix}b{i}`` (bridge side). Entering first deletes stale namespaces with exactly these name
    patterns (left by a killed run); an exclusive lock file per prefix (``/run/slimpar-netns-{prefix}.lock``,
    released by the kernel when its holder dies) keeps a second live network with the same prefix from
    tearing down the first.
    """

    def __init__(self, n_hosts: int, rate_mbit: float | None, prefix: str = "spl") -> None:
        if not 1 <= n_hosts <= 250:
            raise ValueError(f"n_hosts must be in 1..250, got {n_hosts}")
        if not _PREFIX_RE.match(prefix):
            raise ValueError(f"prefix must match {_PREFIX_RE.pattern}, got {prefix!r}")
        self.n_hosts = n_hosts
        self.rate_mbit = rate_mbit
        self.tbf = tbf_params(rate_mbit) if rate_mbit is not None else None
        self.prefix = prefix
        self.switch = f"{prefix}-sw"
        self._lock: IO[str] | None = None

    # ------------------------------------------------------------------ names
    def namespace(self, i: int) -> str:
        return f"{self.prefix}-h{self._check(i)}"

    def ifname(self, i: int) -> str:
        """Host ``i``'s veth interface (inside its namespace): what ``GLOO_SOCKET_IFNAME`` names."""
        return f"{self.prefix}h{self._check(i)}"

    def bridge_port(self, i: int) -> str:
        return f"{self.prefix}b{self._check(i)}"

    def host_ip(self, i: int) -> str:
        return f"{SUBNET}.{self._check(i) + 1}"

    def exec_prefix(self, i: int) -> list[str]:
        """Prepend to a command to run it inside host ``i``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(i)]

    def _check(self, i: int) -> int:
        if not 0 <= i < self.n_hosts:
            raise IndexError(f"host {i} out of range 0..{self.n_hosts - 1}")
        return i

    def _ours(self) -> re.Pattern[str]:
        return re.compile(rf"^{re.escape(self.prefix)}-(sw|h\d+)$")

    # -------------------------------------------------------------- lifecycle
    def __enter__(self) -> ThrottledNetwork:
        _require(["ip"] + (["tc"] if self.tbf else []))
        self._acquire_lock()
        try:
            self._remove_ours()
            self._build()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._teardown()

    def _acquire_lock(self) -> None:
        lock = open(f"/run/slimpar-netns-{self.prefix}.lock", "w")  # held open (and locked) until teardown
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise RuntimeError(f"another ThrottledNetwork with prefix {self.prefix!r} is active on this machine; "
                               "use a different prefix") from None
        self._lock = lock

    def _teardown(self) -> None:
        try:
            left = self._remove_ours()
        finally:
            if self._lock is not None:
                self._lock.close()
                self._lock = None
        if left:
            raise RuntimeError(f"could not delete network namespaces {left}")

    def _remove_ours(self) -> list[str]:
        """Delete every namespace with this network's name patterns; return those still listed."""
        ours = self._ours()
        for name in sorted(n for n in list_namespaces() if ours.match(n)):
            _run(["ip", "netns", "del", name], check=False)  # deleting a namespace also destroys its veths
        return [n for n in list_namespaces() if ours.match(n)]

    def _build(self) -> None:
        sw = self.switch
        _run(["ip", "netns", "add", sw])
        _run(["ip", "-n", sw, "link", "set", "lo", "up"])
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        for i in range(self.n_hosts):
            self._add_host(i)

    def _add_host(self, i: int) -> None:
        ns, sw, host_if, port = self.namespace(i), self.switch, self.ifname(i), self.bridge_port(i)
        _run(["ip", "netns", "add", ns])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        # the pair is created inside the switch namespace with its other end moved straight into the host's:
        # no interface ever appears in the machine's own namespace
        _run(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", host_if, "netns", ns])
        _run(["ip", "-n", sw, "link", "set", port, "master", "br0"])
        _run(["ip", "-n", sw, "link", "set", port, "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{self.host_ip(i)}/24", "dev", host_if])
        _run(["ip", "-n", ns, "link", "set", host_if, "up"])
        if self.tbf is not None:
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", host_if, "root", *self.tbf.tc_args()])
            _run(["tc", "-n", sw, "qdisc", "replace", "dev", port, "root", *self.tbf.tc_args()])

    # ------------------------------------------------------------ inspection
    def link_stats(self, i: int) -> dict[str, int]:
        """Byte and packet counters of host ``i``'s veth, read in its namespace (``ip -s -j link``)."""
        out = _run(["ip", "-n", self.namespace(i), "-s", "-j", "link", "show", "dev", self.ifname(i)]).stdout
        stats = json.loads(out)[0]["stats64"]
        return {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"],
                "tx_packets": stats["tx"]["packets"], "rx_packets": stats["rx"]["packets"]}

    def qdiscs(self, i: int) -> list[str]:
        """``tc qdisc show`` lines for host ``i``'s veth and its bridge port (to record what was applied)."""
        host = _run(["tc", "-n", self.namespace(i), "qdisc", "show", "dev", self.ifname(i)]).stdout
        port = _run(["tc", "-n", self.switch, "qdisc", "show", "dev", self.bridge_port(i)]).stdout
        return [line.strip() for line in (host + port).splitlines() if line.strip()]

    def netem_available(self) -> bool:
        """Whether ``tc`` can add a ``netem`` (delay) qdisc here, probed on the switch namespace's loopback."""
        probe = ["tc", "-n", self.switch, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]
        if shutil.which("tc") is None or _run(probe, check=False).returncode != 0:
            return False
        _run(["tc", "-n", self.switch, "qdisc", "del", "dev", "lo", "root"], check=False)
        return True


# ------------------------------------------------------------------------------------------- processes
def _kill(procs: list[subprocess.Popen]) -> None:
    """SIGKILL each started process's own process group (every one was started in a new session)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait(timeout=CMD_TIMEOUT_S)


def _tail(path: Path, n: int = 4000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-n:]


def free_port(net: ThrottledNetwork, i: int) -> int:
    """A TCP port free on host ``i``'s address, found by binding port 0 inside its namespace."""
    code = "import socket,sys;s=socket.socket();s.bind((sys.argv[1],0));print(s.getsockname()[1])"
    cmd = [*net.exec_prefix(i), sys.executable, "-c", code, net.host_ip(i)]
    return int(subprocess.run(cmd, capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=True).stdout)


def _worker_env(net: ThrottledNetwork, i: int, world: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    pkg_root = str(Path(slimpar.__file__).resolve().parents[1])
    env.update(RANK=str(i), WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR=net.host_ip(0), MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=net.ifname(i),
               MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (pkg_root, os.environ.get("PYTHONPATH", "")) if p))
    return env


def _wait_all(procs: list[subprocess.Popen], logs: Path, timeout_s: float, name: str = "worker",
              stem: str = "rank") -> None:
    """Wait for every worker; on the first failure or at the deadline kill them all and raise.

    Process ``r``'s stderr is ``logs / f"{stem}{r}.err"``; ``name`` is what the messages call a process."""
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                r = failed[0]
                raise RuntimeError(f"{name} {r} exited with {codes[r]}; its stderr:\n{_tail(logs / f'{stem}{r}.err')}")
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                running = [r for r, c in enumerate(codes) if c is None]
                raise RuntimeError(f"{name}s {running} timed out after {timeout_s:.0f} s; {stem} {running[0]} "
                                   f"stderr:\n{_tail(logs / f'{stem}{running[0]}.err')}")
            time.sleep(0.1)
    finally:
        _kill(procs)


def run_in_network(net: ThrottledNetwork, config: str | Path, out: str | Path, overrides: list[str], world: int,
                   timeout_s: float = 900.0) -> dict[str, Any]:
    """Run ``slimpar train`` with worker ``i`` inside host ``i``'s namespace and return rank 0's summary.

    Each worker gets a torchrun-style environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK=0``,
    ``LOCAL_WORLD_SIZE=world`` so it takes cpu_count/world threads, ``MASTER_ADDR`` = host 0's address and a
    free ``MASTER_PORT`` there) and ``GLOO_SOCKET_IFNAME`` = its veth, so all collective traffic goes over
    the (throttled) links. Worker output goes to ``out/workers/rank{i}.{out,err}``. A worker failure or the
    ``timeout_s`` deadline kills the whole set and raises ``RuntimeError`` with the worker's stderr.

    The returned summary gains ``links``: per-host deltas of the veth byte counters over the run
    (``veth_tx_bytes[i]`` = bytes host ``i`` put on its link, headers included), the rate, the applied
    qdiscs, the wall-clock time and ``LATENCY_NOTE``; the same is written to ``out/links.json``.
    """
    if not 1 <= world <= net.n_hosts:
        raise ValueError(f"world must be in 1..{net.n_hosts} for this network, got {world}")
    out = Path(out).resolve()
    logs = out / "workers"
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port(net, 0)
    cmd = [sys.executable, "-m", "slimpar", "train", "--config", str(Path(config).resolve()), "--out", str(out),
           *overrides]
    before = [net.link_stats(i) for i in range(world)]
    t0 = time.perf_counter()
    procs: list[subprocess.Popen] = []
    try:
        for i in range(world):
            with open(logs / f"rank{i}.out", "w") as so, open(logs / f"rank{i}.err", "w") as se:
                procs.append(subprocess.Popen([*net.exec_prefix(i), *cmd], stdout=so, stderr=se,
                                              env=_worker_env(net, i, world, port), start_new_session=True))
    except BaseException:
        _kill(procs)
        raise
    _wait_all(procs, logs, timeout_s)
    wall = time.perf_counter() - t0
    after = [net.link_stats(i) for i in range(world)]
    links = {
        "rate_mbit": net.rate_mbit, "world": world, "wall_s": wall,
        "veth_tx_bytes": [a["tx_bytes"] - b["tx_bytes"] for a, b in zip(after, before, strict=True)],
        "veth_rx_bytes": [a["rx_bytes"] - b["rx_bytes"] for a, b in zip(after, before, strict=True)],
        "qdiscs": [net.qdiscs(i) for i in range(world)], "latency_applied": False, "note": LATENCY_NOTE,
    }
    (out / "links.json").write_text(json.dumps(links, indent=1))
    summary = json.loads((out / "summary.json").read_text())
    return {**summary, "links": links}


# ------------------------------------------------------------------------------------------- raw TCP
