"""Streaming codebook synchronisation: a ResidualVQ sender keeps one receiver's codebook copy exact.

Protocol (docs/methods.md, 'Codebook synchronisation'). The sender owns the codebook and updates
it from data the receiver never sees. After each sender forward, ``CodebookSender.message(step)``
describes how to turn the table the receiver holds into the one that produced the forward's indices:
- "full":  the whole (Q·K, dim) table, at the first message and whenever step % full_every == 0
           (periodic resync bounds the damage of a lost message);
- "delta": only the rows whose bits differ from the last table sent (found by a bitwise diff against
           the sender's snapshot, so several codebook versions between messages coalesce correctly);
- "none":  nothing changed; only the header travels.
The receiver (``CodebookReceiver``) accepts a delta only if its ``base_version`` equals the version
it holds and refuses to decode indices of any version but its own: a lost message is an error, never
a silent mis-decode. The module is transport-agnostic: ``to_tensors`` / ``from_tensors`` turn a
message into a fixed-size header plus variable payload tensors for torch.distributed p2p.

Wire layout (all counted by ``SyncMessage.nbytes()``):
    header  int64 [version, base_version, kind, count]          32 bytes, always sent
            kind: 0 = none, 1 = delta, 2 = full; count = rows carried
    rows    delta only: flat row ids q·K + k, int16 holding uint16 bits if Q·K <= 65,536, else int32
            (a full table sends rows 0..Q·K−1 implicitly, in order)
    values  delta and full: (count, dim) float32, bit-exact copies of the sender's rows
so nbytes = 32 + count · (index_bytes if delta else 0) + count · dim · 4.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slimpar.codecs.packing import UINT16_LIMIT
from slimpar.codecs.rvq import ResidualVQ, decode_indices

KINDS = ("none", "delta", "full")
HEADER_NUMEL = 4
HEADER_DTYPE = torch.int64
VALUE_DTYPE = torch.float32


class CodebookVersionError(RuntimeError):
    """The receiver's codebook version does not match what a message or a decode request expects."""


def row_index_dtype(num_rows: int) -> torch.dtype:
    """Wire dtype of delta row ids: int16 (uint16 bits) when Q·K <= 65,536, else int32."""
    return torch.int16 if num_rows <= UINT16_LIMIT else torch.int32


@dataclass
class SyncMessage:
    """One codebook update. ``rows`` are flat ids into Q·K (int64 here), ``values`` (n, dim) float32."""

    version: int
    base_version: int
    kind: str
    rows: torch.Tensor  # (n,) int64
    values: torch.Tensor  # (n, dim) float32
    num_rows: int  # Q·K, known to both ends, not sent

    def nbytes(self) -> int:
        """Exact bytes on the wire: header + (delta) row ids + float32 values."""
        index_bytes = row_index_dtype(self.num_rows).itemsize
        n, dim = self.values.shape
        ids = n * index_bytes if self.kind == "delta" else 0
        return HEADER_NUMEL * 8 + ids + n * dim * 4

    def to_tensors(self) -> list[torch.Tensor]:
        """[header] + [rows] (delta only) + [values] (delta/full): what a transport sends, in order."""
        header = torch.tensor(
            [self.version, self.base_version, KINDS.index(self.kind), self.rows.numel()], dtype=HEADER_DTYPE
        )
        out = [header]
        if self.kind == "delta":
            rows = self.rows.to(torch.int64)
            if row_index_dtype(self.num_rows) == torch.int16:
                rows = torch.where(rows >= (1 << 15), rows - UINT16_LIMIT, rows)
            out.append(rows.to(row_index_dtype(self.num_rows)))
        if self.kind != "none":
            out.append(self.values.to(VALUE_DTYPE))
        return out

    @staticmethod
    def payload_specs(
        header: torch.Tensor | list[int], num_rows: int, dim: int
    ) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """Shapes and dtypes of the tensors that follow ``header`` (a tensor, or its values already read), for
        preallocating receive buffers."""
        values = header.tolist() if isinstance(header, torch.Tensor) else header
        kind, count = KINDS[int(values[2])], int(values[3])
        specs: list[tuple[tuple[int, ...], torch.dtype]] = []
        if kind == "delta":
            specs.append(((count,), row_index_dtype(num_rows)))
        if kind != "none":
            specs.append(((count, dim), VALUE_DTYPE))
        return specs

    @classmethod
    def from_tensors(cls, tensors: list[torch.Tensor], num_rows: int, dim: int,
                     header_values: list[int] | None = None) -> SyncMessage:
        """Rebuild a message from ``to_tensors()`` output (header first; ``header_values``: its values, where the
        receiver already read them)."""
        header = tensors[0]
        if header.numel() != HEADER_NUMEL:
            raise ValueError(f"header must have {HEADER_NUMEL} int64 entries, got {header.numel()}")
        values = header_values if header_values is not None else header.tolist()
        version, base, kind_code, count = (int(v) for v in values)
        kind = KINDS[kind_code]
        specs = cls.payload_specs(values, num_rows, dim)
        if len(tensors) != 1 + len(specs):
            raise ValueError(f"a {kind!r} message needs {1 + len(specs)} tensors")
        if kind == "delta":
            rows = (
                tensors[1].to(torch.int64) & 0xFFFF if tensors[1].dtype == torch.int16 else tensors[1].long()
            )
        elif kind == "full":
            rows = torch.arange(num_rows, device=tensors[-1].device)
        else:  # "none": empty, on the device the message came on, like the other kinds' rows and values
            rows = torch.zeros(0, dtype=torch.int64, device=header.device)
        values = tensors[-1] if kind != "none" else torch.zeros(0, dim, dtype=VALUE_DTYPE, device=header.device)
        if rows.numel() != count or values.shape != (count, dim):
            raise ValueError(f"payload sizes do not match header count {count}")
        return cls(version, base, kind, rows, values, num_rows)


class CodebookSender:
    """Sender side: turns a ResidualVQ's codebook changes into ``SyncMessage``s and counts bytes."""

    def __init__(self, rvq: ResidualVQ, full_every: int):
        if full_every < 0:
            raise ValueError(
                f"full_every must be >= 0 (0 = only the first message is full), got {full_every}"
            )
        self.rvq, self.full_every = rvq, full_every
        self._snapshot: torch.Tensor | None = None  # (Q·K, dim) table the receiver holds
        self._sent_version = -1
        self.bytes_sent = 0
        self.messages = {kind: 0 for kind in KINDS}
        self._none: tuple[torch.Tensor, torch.Tensor] | None = None

    def message(self, step: int) -> SyncMessage:
        """The message bringing the receiver to the sender's current codebook (call after each forward)."""
        version, num_rows = self.rvq.version, self.rvq.levels * self.rvq.codebook_size
        full = self._snapshot is None or (self.full_every and step % self.full_every == 0)
        if not full and version == self._sent_version:  # nothing changed: no diff, so no wait for the device
            msg = SyncMessage(version, version, "none", *self._empty(), num_rows)
        else:
            msg = self._changes(version, full)
        self._sent_version = version
        self.bytes_sent += msg.nbytes()
        self.messages[msg.kind] += 1
        return msg

    def _changes(self, version: int, full: bool) -> SyncMessage:
        """A "full" message, or a "delta" with the rows that differ from the table last sent."""
        table = self.rvq.codebooks.detach().reshape(-1, self.rvq.dim).to(VALUE_DTYPE)  # (Q·K, dim)
        if full:
            return self._full(table, version)
        diff = (table.view(torch.int32) != self._snapshot.view(torch.int32)).any(1)  # (Q·K,)
        rows = diff.nonzero().squeeze(1)  # the one wait for the device: the delta's length
        msg = SyncMessage(version, self._sent_version, "delta", rows, table[rows].clone(), table.shape[0])
        self._snapshot[rows] = table[rows]
        return msg

    def _empty(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A "none" message's rows and values: empty, on the codebook's device, made once (nothing writes them)."""
        device = self.rvq.codebooks.device
        if self._none is None or self._none[0].device != device:
            self._none = (torch.zeros(0, dtype=torch.int64, device=device),
                          torch.zeros(0, self.rvq.dim, dtype=VALUE_DTYPE, device=device))
        return self._none

    def _full(self, table: torch.Tensor, version: int) -> SyncMessage:
        self._snapshot = table.clone()
        rows = torch.arange(table.shape[0], device=table.device)
        return SyncMessage(version, self._sent_version, "full", rows, table.clone(), table.shape[0])


class CodebookReceiver:
    """Receiver side: a codebook copy (Q, K, dim) and the version it holds (−1 before the first full)."""

    def __init__(self, dim: int, levels: int, codebook_size: int, device: torch.device | str | None = None):
        self.dim, self.levels, self.codebook_size = dim, levels, codebook_size
        self.codebooks = torch.zeros(levels, codebook_size, dim, dtype=VALUE_DTYPE, device=device)
        self.version = -1
        self.bytes_received = 0

    def apply(self, msg: SyncMessage) -> None:
        """Install a message; a delta/none whose base is not the held version raises CodebookVersionError."""
        if msg.num_rows != self.levels * self.codebook_size or msg.values.shape[1:] != (self.dim,):
            raise ValueError("message table shape does not match this receiver")
        table = self.codebooks.view(-1, self.dim)  # (Q·K, dim)
        if msg.kind == "full":
            table.copy_(msg.values)
        elif msg.base_version != self.version or self.version < 0:
            raise CodebookVersionError(
                f"{msg.kind} message goes from version {msg.base_version} to {msg.version}, but the receiver "
                f"holds version {self.version}: a message was lost or reordered; wait for a full table"
            )
        elif msg.kind == "delta":
            table[msg.rows.to(table.device)] = msg.values.to(table.device, VALUE_DTYPE)
        elif msg.version != self.version:
            raise CodebookVersionError(
                f"'none' message claims version {msg.version}, receiver has {self.version}"
            )
        self.version = msg.version
        self.bytes_received += msg.nbytes()

    def decode(self, indices: torch.Tensor, version: int) -> torch.Tensor:
        """Reconstruction (..., dim) float32 of indices (..., Q) produced under codebook ``version``."""
        if version != self.version:
            raise CodebookVersionError(
                f"indices need codebook version {version}, the receiver holds {self.version}"
            )
        return decode_indices(self.codebooks, indices.to(self.codebooks.device))
