"""Point-to-point with NCCL's rules on gloo: no message tags, and a send that waits for its matching receive.

NCCL matches the messages of a pair of ranks in one communicator in the order they are posted (it has no tags),
and a send of a message larger than its buffers cannot finish before the peer has posted the matching receive;
only the ops of one ``batch_isend_irecv`` group progress together. gloo has tags and buffers any send, so a
protocol that relies on either passes on CPU and hangs on GPUs. :func:`install` makes ``torch.distributed``'s
point-to-point calls in this process behave like NCCL's worst case:

* every tag is dropped (gloo then matches a pair's messages in posting order, as NCCL does);
* ``isend`` / ``send`` first wait until the peer has posted its matching receive (the n-th receive it posted
  from this rank in this group), counted in the job's store; after ``TIMEOUT`` seconds they raise
  :class:`Deadlock`, naming both ranks, instead of hanging;
* ``batch_isend_irecv`` posts the group's receives before its sends, as one NCCL group posts them together.

Used by tests/distributed/test_pipeline_rendezvous.py, in slimpar's worker processes through
``tests/rendezvous_site/sitecustomize.py`` (``SLIMPAR_TEST_RENDEZVOUS=1``). With ``SLIMPAR_RENDEZVOUS_LOG`` set,
each worker writes how many sends it matched to ``<log>.<RANK>`` when it exits, so a test can tell the rule was on.
"""

from __future__ import annotations

import atexit
import os
import time
from collections import Counter

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

TIMEOUT = 60.0  # seconds a send waits for its receive before it is called a deadlock
_ORIGINAL = {name: getattr(c10d, name) for name in ("isend", "irecv", "send", "recv", "batch_isend_irecv")}
_posted: Counter = Counter()  # (group, src, dst) -> receives this rank posted, or sends it started
_matched = [0]


class Deadlock(RuntimeError):
    """A send whose receive was never posted: both ends wait for each other (NCCL would hang)."""


def _key(group, src: int, dst: int) -> str:
    name = (group or dist.group.WORLD).group_name
    return f"rendezvous/{name}/{src}->{dst}"


def _global(group, rank: int | None, group_rank: int | None) -> int:
    if rank is not None:
        return rank
    return dist.get_global_rank(group or dist.group.WORLD, group_rank)


def _receive_posted(group, src: int) -> None:
    me = dist.get_rank()
    c10d._get_default_store().add(_key(group, src, me), 1)


def _wait_for_receive(group, dst: int) -> None:
    me = dist.get_rank()
    _posted[(_key(group, me, dst), "send")] += 1
    n, key, store = _posted[(_key(group, me, dst), "send")], _key(group, me, dst), c10d._get_default_store()
    deadline = time.monotonic() + TIMEOUT
    while store.add(key, 0) < n:
        if time.monotonic() > deadline:
            raise Deadlock(f"rank {me}'s send #{n} to rank {dst} found no matching receive after {TIMEOUT:.0f} s: "
                           "the two ends wait for each other (NCCL would hang here)")
        time.sleep(0.002)
    _matched[0] += 1


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    _wait_for_receive(group, _global(group, dst, group_dst))
    return _ORIGINAL["isend"](tensor, dst, group, 0, group_dst)


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    _wait_for_receive(group, _global(group, dst, group_dst))
    return _ORIGINAL["send"](tensor, dst, group, 0, group_dst)


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    _receive_posted(group, _global(group, src, group_src))
    return _ORIGINAL["irecv"](tensor, src, group, 0, group_src)


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    if src is None and group_src is None:
        raise Deadlock("a receive from any source has no NCCL equivalent")
    _receive_posted(group, _global(group, src, group_src))
    return _ORIGINAL["recv"](tensor, src, group, 0, group_src)


def batch_isend_irecv(p2p_op_list):
    """Receives first, then sends (each waiting for its receive): one NCCL group posts them all at once."""
    works = [None] * len(p2p_op_list)
    order = sorted(range(len(p2p_op_list)), key=lambda i: p2p_op_list[i].op not in (irecv, _ORIGINAL["irecv"]))
    for i in order:
        op = p2p_op_list[i]
        receive = op.op in (irecv, _ORIGINAL["irecv"])
        call = irecv if receive else isend
        works[i] = call(op.tensor, op.peer, op.group, 0, None if op.peer is not None else op.group_peer)
    return works


def install() -> None:
    """Replace point-to-point in ``torch.distributed`` (and its c10d module, whose ``P2POp`` checks the op)."""
    for name, fn in (("isend", isend), ("irecv", irecv), ("send", send), ("recv", recv),
                     ("batch_isend_irecv", batch_isend_irecv)):
        setattr(c10d, name, fn)
        setattr(dist, name, fn)
    log, rank = os.environ.get("SLIMPAR_RENDEZVOUS_LOG"), os.environ.get("RANK")
    if log and rank is not None:  # a worker (the launcher has no rank)
        atexit.register(_write, f"{log}.{rank}")


def matched() -> int:
    """Sends this process started after their receive was posted."""
    return _matched[0]


def _write(path: str) -> None:
    with open(path, "w") as f:
        f.write(str(_matched[0]))
