"""A raw TCP throughput probe between two hosts of a ``ThrottledNetwork`` (checks the tbf limits)."""

from __future__ import annotations

import json
import select
import subprocess
import sys

from benchmarks.network.links import ThrottledNetwork, _kill, free_port

_SERVER = """
import json, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.settimeout(float(sys.argv[3]))
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); c.settimeout(float(sys.argv[3])); t0 = time.perf_counter(); n = 0
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    n += len(b)
dt = time.perf_counter() - t0
print(json.dumps({"bytes": n, "seconds": dt}), flush=True); c.close()
"""

_CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))
left, chunk = int(sys.argv[3]), b"x" * (1 << 16)
while left > 0:
    c.sendall(chunk[:left]); left -= min(left, len(chunk))
c.shutdown(socket.SHUT_WR); c.recv(1)
"""


def measure_tcp_throughput(net: ThrottledNetwork, src: int, dst: int, nbytes: int = 5 * 2**20,
                           timeout_s: float = 60.0) -> dict[str, float]:
    """Send ``nbytes`` over one TCP connection from host ``src`` to host ``dst`` and time it at the receiver.

    A tiny socket server runs in ``dst``'s namespace, a client in ``src``'s; the server times from accepting
    the connection to end-of-stream and reports the payload rate (``mbit_s`` in 10^6 bit/s, TCP/IP headers
    not counted). Both processes are bounded by ``timeout_s`` and killed on any error.
    """
    port = free_port(net, dst)
    args = [str(timeout_s)]
    server = subprocess.Popen([*net.exec_prefix(dst), sys.executable, "-c", _SERVER, net.host_ip(dst), str(port),
                               *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    procs = [server]
    try:
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], timeout_s)
        if not ready or server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"throughput server did not start: {server.stderr.read() if server.stderr else ''}")
        client = subprocess.run([*net.exec_prefix(src), sys.executable, "-c", _CLIENT, net.host_ip(dst), str(port),
                                 str(nbytes), *args], capture_output=True, text=True, timeout=timeout_s)
        if client.returncode != 0:
            raise RuntimeError(f"throughput client failed: {client.stderr[-2000:]}")
        res_out, res_err = server.communicate(timeout=timeout_s)
        if server.returncode != 0:
            raise RuntimeError(f"throughput server failed: {res_err[-2000:]}")
    finally:
        _kill(procs)
    res = json.loads(res_out.strip().splitlines()[-1])
    return {**res, "mbit_s": res["bytes"] * 8 / res["seconds"] / 1e6}
