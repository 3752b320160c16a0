"""A rendezvous for slimpar's one-host launcher whose store listens on the loopback interface only.

torch's c10d rendezvous hosts a TCPStore that listens on every interface (TCPStore binds ``*``), and the
workers share that store (``TORCHELASTIC_USE_AGENT_STORE``). A job on one machine needs nothing outside it to
reach either. So slimpar's launcher registers this rendezvous under :data:`NAME`, through torch's documented
handler registry: torch's own dynamic rendezvous on a c10d backend, over a TCPStore handed a socket already
bound to 127.0.0.1 (TCPStore's ``master_listen_fd``), and the same for the second store server the rendezvous
starts for the workers. The agent's ``local_addr`` is 127.0.0.1, so the workers' ``MASTER_ADDR`` is the
loopback too, and gloo binds its sockets to ``lo`` (``GLOO_SOCKET_IFNAME``, set by the launcher unless the user
set it).
"""

from __future__ import annotations

import socket
from datetime import timedelta

NAME = "slimpar-loopback"
LOOPBACK = "127.0.0.1"


def loopback_store(timeout: timedelta = timedelta(seconds=300)):
    """A TCPStore server that listens on 127.0.0.1 only: it is handed a socket already bound there."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, 0))
    port = sock.getsockname()[1]
    # the store takes the file descriptor over (detach: the Python object must not close it)
    return dist.TCPStore(LOOPBACK, port, is_master=True, multi_tenant=True, timeout=timeout,
                         master_listen_fd=sock.detach())


def _create_handler(params):
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, create_handler

    class LoopbackBackend(C10dRendezvousBackend):
        @property
        def name(self) -> str:  # create_handler checks it against the requested backend
            return NAME

    class LoopbackHandler(DynamicRendezvousHandler):
        # The rendezvous also starts a second store server for the workers (MASTER_ADDR:MASTER_PORT, "TCPStore
        # sharing"); torch 2.13 (pinned) builds it in this method, listening on every interface.
        # tests/distributed/test_failures_clean.py checks that no socket of a job listens beyond the loopback.
        def _create_tcp_store_server(self, master_addr, master_port):
            return loopback_store()

    store = loopback_store(timedelta(seconds=int(params.get_as_int("read_timeout", 60))))
    handler = create_handler(store, LoopbackBackend(store, params.run_id), params)
    handler.__class__ = LoopbackHandler  # the same object, with the store server above
    return handler


def register() -> str:
    """Register :data:`NAME` once per process (torch's registry refuses nothing, later wins); returns it."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(NAME, _create_handler)
    return NAME
