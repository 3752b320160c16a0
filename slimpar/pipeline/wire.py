"""What crosses a pipeline boundary, how it is counted, and the two transports that carry it.

Every tensor put on a link is a ``Packet`` with a category — ``payload`` (activations or their
gradients), ``ids`` (token ids), ``codebook`` (RVQ synchronisation), ``sync`` (gradient exchange,
checksums and resyncs of parameters both ends hold) or ``tied`` (the same for a tied token embedding
and head) — and is counted by ``ByteCounter`` at the send, per (boundary, direction, category). "fwd"
is sender → receiver (stage p → p + 1), "bwd" the reverse. The tied link between stage 0 and stage
P − 1 is counted under boundary number P − 1 (the link that closes the pipeline into a ring; no
boundary has that number), "fwd" from stage 0 (the embedding) to stage P − 1 (the head).

Transports (one ``Link`` per boundary end):
- ``P2PLink``: ``torch.distributed`` isend/irecv to the peer rank. Each channel has its own tag, but
  nothing depends on it: NCCL has no tags and matches a pair's messages in the order they are posted, so
  both ends post theirs in the same order (the schedule's, then the exchanges', in plan order), which
  tests/distributed/test_pipeline_rendezvous.py checks with every tag dropped;
- ``LocalLink``: an in-process pair of queues for the single-process virtual pipeline; it checks the
  shape and dtype of every receive, so protocol mistakes fail loudly in tests.
Receives are two-phase (``irecv`` returns buffers and handles; ``wait_all`` completes them). An exchange in
both directions (``exchange``: shared-parameter gradients, checksums) posts its sends and receives as one
``batch_isend_irecv`` group: a NCCL send of a message larger than its buffers waits for the matching
receive, so two ends that each sent before receiving would wait for each other.
"""

from __future__ import annotations

import abc
import math
from collections import defaultdict, deque
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

CATEGORIES = ("payload", "ids", "codebook", "sync", "tied")
DIRECTIONS = ("fwd", "bwd")
# Tags of the messages slimpar adds next to the schedule's (tag 0) activations and gradients.
TAG_CODEBOOK = 101  # variable-size codebook rows that follow a header
TAG_SYNC = 102  # gradient exchange of shared parameters
TAG_CHECK = 103  # checksums and resyncs
TAG_EVAL = 104  # evaluation forwards (not counted as training traffic)
TAG_TIED_SYNC = 105  # gradient exchange of a tied embedding and head (stage 0 <-> stage P - 1)
TAG_TIED_CHECK = 106  # their checksums and resyncs


@dataclass(frozen=True)
class WireSpec:
    """Shape and dtype of one tensor a receiver must preallocate."""

    category: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()

    def empty(self, device: torch.device | str | None = None) -> Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device=device)


@dataclass
class Packet:
    category: str
    tensor: Tensor

    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()


@dataclass
class Message:
    """One boundary message: a fixed part whose shapes the receiver knows in advance, and an optional
    variable tail (codebook rows) whose sizes the fixed part announces."""

    fixed: list[Packet]
    extra: list[Packet] = field(default_factory=list)


def split_batch(t: Tensor, parts: int) -> list[Tensor]:
    """``parts`` equal views of ``t`` along dim 0 (the microbatches of a one-pass step, in order)."""
    return list(t.split(t.shape[0] // parts)) if parts > 1 else [t]


def split_packets(packets: list[Packet], parts: int) -> list[list[Packet]]:
    """Per-token packets of a whole batch as the ``parts`` microbatches' packets: what a microbatched schedule
    sends, tensor for tensor (every packet is (b, ...) with one entry per token or per sequence)."""
    if parts == 1:
        return [packets]
    chunks = [split_batch(p.tensor, parts) for p in packets]
    return [[Packet(p.category, c[m]) for p, c in zip(packets, chunks, strict=True)] for m in range(parts)]


class ByteCounter:
    """Bytes put on the wire by this process, per (boundary, direction, category): totals and last step."""

    def __init__(self) -> None:
        self.total: dict[tuple[int, str, str], int] = defaultdict(int)
        self.step: dict[tuple[int, str, str], int] = defaultdict(int)
        self.steps = 0
        self.enabled = True  # evaluation traffic is not training traffic

    def add(self, boundary: int, direction: str, category: str, nbytes: int) -> None:
        if not self.enabled:
            return
        if direction not in DIRECTIONS or category not in CATEGORIES:
            raise ValueError(f"unknown direction/category {direction!r}/{category!r}")
        key = (boundary, direction, category)
        self.total[key] += nbytes
        self.step[key] += nbytes

    def begin_step(self) -> None:
        self.step = defaultdict(int)
        self.steps += 1

    def step_bytes(self, direction: str | None = None) -> int:
        return sum(n for (_, d, _), n in self.step.items() if direction in (None, d))

    def as_rows(self) -> list[list]:
        """[boundary, direction, category, total bytes] rows, for gathering across ranks."""
        return [[b, d, c, n] for (b, d, c), n in sorted(self.total.items())]


class Link(abc.ABC):
    """One end of a boundary: sends go out in ``direction`` and are counted; receives come from the peer."""

    def __init__(self, boundary: int, direction: str, counter: ByteCounter):
        self.boundary, self.direction, self.counter = boundary, direction, counter

    def count(self, packets: list[Packet]) -> None:
        for p in packets:
            self.count_bytes(p.category, p.nbytes())

    def count_bytes(self, category: str, nbytes: int) -> None:
        """Count ``nbytes`` sent in ``category`` without a tensor of them (a part of a stacked buffer)."""
        self.counter.add(self.boundary, self.direction, category, nbytes)

    @abc.abstractmethod
    def isend(self, packets: list[Packet], tag: int) -> list:
        """Start sending ``packets``; returns the works to wait on."""

    @abc.abstractmethod
    def irecv(self, specs: list[WireSpec], tag: int) -> tuple[list[Tensor], list]:
        """Start receiving tensors of ``specs``; returns (buffers, works)."""

    def exchange(self, packets: list[Packet], specs: list[WireSpec], tag: int) -> tuple[list[Tensor], list]:
        """Send ``packets`` and receive tensors of ``specs`` from the peer, which calls the same; returns the
        received buffers and every work (sends and receives) to wait on."""
        sends = self.isend(packets, tag)
        bufs, recvs = self.irecv(specs, tag)
        return bufs, sends + recvs


class P2PLink(Link):
    """torch.distributed point-to-point to ``peer`` (a global rank) within ``group``."""

    def __init__(self, boundary: int, direction: str, counter: ByteCounter, peer: int,
                 group: dist.ProcessGroup | None, device: torch.device | str = "cpu"):
        super().__init__(boundary, direction, counter)
        self.peer, self.group, self.device = peer, group, device

    def isend(self, packets: list[Packet], tag: int) -> list:
        self.count(packets)
        return [dist.isend(p.tensor.contiguous(), dst=self.peer, group=self.group, tag=tag) for p in packets]

    def irecv(self, specs: list[WireSpec], tag: int) -> tuple[list[Tensor], list]:
        bufs = [s.empty(self.device) for s in specs]
        return bufs, [dist.irecv(b, src=self.peer, group=self.group, tag=tag) for b in bufs]

    def exchange(self, packets: list[Packet], specs: list[WireSpec], tag: int) -> tuple[list[Tensor], list]:
        """One ``batch_isend_irecv`` group (a NCCL group: its sends and receives progress together)."""
        self.count(packets)
        bufs = [s.empty(self.device) for s in specs]
        ops = [dist.P2POp(dist.isend, p.tensor.contiguous(), self.peer, self.group, tag) for p in packets]
        ops += [dist.P2POp(dist.irecv, b, self.peer, self.group, tag) for b in bufs]
        return bufs, dist.batch_isend_irecv(ops) if ops else []


class _LocalReceive:
    """Deferred receive from a LocalLink queue: copies into the buffers on ``wait``."""

    def __init__(self, queue: deque, bufs: list[Tensor]):
        self.queue, self.bufs = queue, bufs

    def wait(self) -> None:
        for buf in self.bufs:
            if not self.queue:
                raise RuntimeError("local link: receive posted with nothing sent (protocol order error)")
            t = self.queue.popleft()
            if t.shape != buf.shape or t.dtype != buf.dtype:
                raise RuntimeError(f"local link: expected {tuple(buf.shape)} {buf.dtype}, got "
                                   f"{tuple(t.shape)} {t.dtype}")
            buf.copy_(t)


class LocalLink(Link):
    """In-process link: a queue per direction, shared by the two ends built by ``LocalLink.pair``."""

    def __init__(self, boundary: int, direction: str, counter: ByteCounter, out: deque, inbox: deque,
                 device: torch.device | str | None = None):
        super().__init__(boundary, direction, counter)
        self.out, self.inbox, self.device = out, inbox, device

    @classmethod
    def pair(cls, boundary: int, counter: ByteCounter,
             device: torch.device | str | None = None) -> tuple[LocalLink, LocalLink]:
        """(sender end, receiver end) of boundary ``boundary``; receive buffers live on ``device``."""
        fwd, bwd = deque(), deque()
        return cls(boundary, "fwd", counter, fwd, bwd, device), cls(boundary, "bwd", counter, bwd, fwd, device)

    def isend(self, packets: list[Packet], tag: int) -> list:
        self.count(packets)
        self.out.extend((p.tensor.detach() if p.tensor.requires_grad else p.tensor).clone()  # the wire does not alias
                        for p in packets)
        return []

    def irecv(self, specs: list[WireSpec], tag: int) -> tuple[list[Tensor], list]:
        bufs = [s.empty(self.device) for s in specs]
        return bufs, [_LocalReceive(self.inbox, bufs)] if bufs else []


def wait_all(handles: list) -> None:
    for h in handles:
        h.wait()


def send_message(link: Link, msg: Message, tag: int = 0, extra_tag: int = TAG_CODEBOOK) -> list:
    """Send a message's fixed part (on ``tag``) and its variable tail (on ``extra_tag``)."""
    return link.isend(msg.fixed, tag) + link.isend(msg.extra, extra_tag)


def recv_message(link: Link, decoder, shape: tuple[int, int], tag: int = 0,
                 extra_tag: int = TAG_CODEBOOK) -> tuple[list[Tensor], list[Tensor]]:
    """Receive a message for ``decoder`` (fixed part first, then the tail it announces)."""
    fixed, handles = link.irecv(decoder.fixed_spec(shape), tag)
    wait_all(handles)
    extra, handles = link.irecv(decoder.extra_spec(fixed), extra_tag)
    wait_all(handles)
    return fixed, extra
