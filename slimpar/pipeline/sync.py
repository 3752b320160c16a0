"""Keep the two copies of a boundary's shared parameters identical: gradient exchange, checksum, resync.

Both ends of boundary p hold MAPL's A_p (and, in the symmetric anchor form, the anchor table). Each
end's backward produces only its own part of the gradient — the sender's (h − o)g_cᵀ, the receiver's
(∂L/∂ĥ)cᵀ. The **Decision** of docs/methods.md, 'Shared projector gradients', implemented here:

  every step, after the backward (and after the replicas' gradient average)
    phase 1 ``post``:   each end quantizes its part of every shared parameter to int8 with one float32
                        scale per row (slimpar.codecs.quant.Int8Codec) and sends it to the other end —
                        A dense (d×r), anchor tables only on the rows of the step's distinct token ids
                        (u×m; both ends know the ids, so no row indices travel);
    phase 2 ``finish``: both ends set grad = deq(sender part) + deq(receiver part), the same bits on
                        both, so the identical deterministic update (SPEL / AdamW) follows.
  every ``checksum_every`` steps
    ``check_post`` / ``check_finish``: both ends exchange an 8-byte digest of each shared parameter;
                        on any mismatch the sender sends its values and the receiver adopts them.
                        Optimizer state needs no resync: it is a function of the (identical) gradients.

Why int8 parts by default (**Decision**; ``--pipeline.sync_dtype fp32`` gives the exact sum): the
exchange is d·r numbers per step against (tokens per step)·r of payload, so at CPU-scale batches
(2,048 tokens, d = 256, 4×) fp32 parts add 12.5% to a boundary's payload, bf16 6.3%, int8 3.3% (d·r
+ 4d bytes). Both ends sum the *dequantized* parts, so the two copies stay bit-identical; the error
(at most half a quantization step, max|row|/254) is far below the minibatch gradient noise, and SPEL
only uses the direction of the momentum. At pretraining batch sizes the exchange is negligible in
any format. All bytes are counted as ``sync``.

A frozen parameter (``freeze``, used for ``pipeline.freeze_projector_after``) leaves the exchange on
both ends at the same step: its gradient parts are no longer sent, but its checksum still is.

Tied embeddings (``model.tie_embeddings``) use the same two phases between stage 0 (the "sender" end,
holding the token embedding) and stage P − 1 (the "receiver" end, holding the head): one more
``SharedParamSync`` per end with ``dtype = "fp32"``, byte kind ``tied`` and its own tags, whose only
parameter is marked ``SENDER_ROWS``: the embedding's gradient is zero outside the step's distinct ids,
so stage 0 sends only those u rows (u×d fp32), while the head's gradient is dense and stage P − 1
sends all V×d fp32. Both ends then set grad = head part + embedding part on those rows (docs/pipeline.md).

The two phases let both ends post their sends before either waits, on a P2PLink (two ranks) or a
LocalLink (the virtual pipeline calls post on both ends, then finish on the sender, then the receiver).
Each end posts its parts and its receive as one exchange (``Link.exchange``: one ``batch_isend_irecv``
group on a P2PLink), never a send then a receive: under NCCL two ends that each sent a part larger than
its buffers before receiving would wait for each other forever (the tied head's gradient is 98 MB at 134M
parameters and a 32k vocabulary). A resync is one-way (the sender sends, the receiver receives).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from slimpar.codecs.quant import Int8Codec, Int8Payload
from slimpar.parallel.fingerprint import fingerprint
from slimpar.pipeline.wire import TAG_CHECK, TAG_SYNC, TAG_TIED_CHECK, TAG_TIED_SYNC, Link, Packet, WireSpec, wait_all

SYNC_DTYPES = ("int8", "bf16", "fp32")
# The third field of a shared parameter entry: False (both parts dense), True (both parts on the
# step's distinct-id rows: anchor tables) or SENDER_ROWS (the sender's part on those rows, the
# receiver's dense: a tied embedding (sender) and head (receiver)).
SENDER_ROWS = "sender_rows"
TIED_TAGS = (TAG_TIED_SYNC, TAG_TIED_CHECK)


def encode_part(g: Tensor, dtype: str) -> list[Tensor]:
    """The wire form of one gradient part: [int8 values, float32 row scales] or [bf16] or [fp32]."""
    if dtype == "int8":
        q = Int8Codec().encode(g.float())
        return [q.values.contiguous(), q.scale.contiguous()]
    return [g.to(torch.bfloat16 if dtype == "bf16" else torch.float32).contiguous()]


def grad_or_zeros(p: nn.Parameter) -> Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def part_specs(shape: tuple[int, ...], dtype: str, category: str) -> list[WireSpec]:
    """What ``encode_part`` makes of a gradient part of ``shape``, for preallocating its receive."""
    if dtype == "int8":
        return [WireSpec(category, shape, torch.int8), WireSpec(category, (*shape[:-1], 1), torch.float32)]
    return [WireSpec(category, shape, torch.bfloat16 if dtype == "bf16" else torch.float32)]


def rows_part(sparse: bool | str, role: str) -> bool:
    """Whether ``role``'s gradient part of a parameter with mode ``sparse`` covers only the step's rows."""
    return sparse is True or (sparse == SENDER_ROWS and role == "sender")


def decode_part(parts: list[Tensor], dtype: str) -> Tensor:
    if dtype == "int8":
        return Int8Codec().decode(Int8Payload(parts[0], parts[1]))
    return parts[0].float()


def install_sum(p: nn.Parameter, s: Tensor, r: Tensor, sparse: bool | str, rows: Tensor | None) -> None:
    """p.grad = the sender's decoded part ``s`` + the receiver's ``r`` (on the step's ``rows`` where a part covers
    only those), in that order: identical bits on both ends."""
    if sparse == SENDER_ROWS:  # rows of the sender's part onto the receiver's dense part
        g = r.view_as(p).clone()
        g[rows] = s + g[rows]
    elif sparse:
        g = torch.zeros_like(p)
        g[rows] = s + r
    else:
        g = (s + r).view_as(p)
    set_grad(p, g)


def set_grad(p: nn.Parameter, g: Tensor) -> None:
    if p.grad is None:
        p.grad = g
    else:  # in place: under the hybrid the gradient is a view of a sync bucket, which a new tensor here
        p.grad.copy_(g)  # would keep alive beside it (the bucket's other views hold it) for the whole step


class SharedParamSync:
    """One end (``role`` = "sender" | "receiver") of a boundary's shared-parameter synchronisation.

    ``category`` is the byte kind its packets are counted as, ``tags`` its (exchange, checksum) tags.
    """

    def __init__(self, params: list[tuple[str, nn.Parameter, bool | str]], role: str, link: Link,
                 dtype: str = "int8", category: str = "sync", tags: tuple[int, int] = (TAG_SYNC, TAG_CHECK)):
        if role not in ("sender", "receiver"):
            raise ValueError(f"role must be 'sender' or 'receiver', got {role!r}")
        if dtype not in SYNC_DTYPES:
            raise ValueError(f"sync dtype must be one of {SYNC_DTYPES}, got {dtype!r}")
        self.params, self.role, self.link, self.dtype = params, role, link, dtype
        self.category, (self.tag, self.check_tag) = category, tags
        self.resyncs = 0
        self.frozen: set[str] = set()  # names whose gradient exchange has stopped (still checksummed)
        self._pending: tuple | None = None

    def freeze(self, name: str) -> None:
        """Stop exchanging ``name``'s gradient (a frozen A): both ends must freeze it at the same step."""
        self.frozen.add(name)

    def _active(self) -> list[tuple[str, nn.Parameter, bool]]:
        return [t for t in self.params if t[0] not in self.frozen]

    # -- gradient exchange ------------------------------------------------------------------------
    def post(self, rows: Tensor | None = None) -> None:
        """Send this end's encoded gradient parts; ``rows`` = the step's distinct ids (anchor tables, tied)."""
        other = "receiver" if self.role == "sender" else "sender"
        mine, specs = [], []
        for _, p, sparse in self._active():
            mine += self._part(p, rows if rows_part(sparse, self.role) else None)
            shape = (len(rows), *p.shape[1:]) if rows_part(sparse, other) else tuple(p.shape)
            specs += part_specs(shape, self.dtype, self.category)
        theirs, handles = self.link.exchange([Packet(self.category, t) for t in mine], specs, self.tag)
        self._pending = (mine, theirs, rows, handles)

    def finish(self) -> None:
        """Wait for the other end's parts and install grad = dec(sender part) + dec(receiver part)."""
        mine, theirs, rows, handles = self._pending
        wait_all(handles)
        n = 2 if self.dtype == "int8" else 1  # wire tensors per parameter
        for i, (_, p, sparse) in enumerate(self._active()):
            a = decode_part(mine[n * i:n * i + n], self.dtype)
            b = decode_part(theirs[n * i:n * i + n], self.dtype)
            install_sum(p, *((a, b) if self.role == "sender" else (b, a)), sparse, rows)
        self._pending = None

    def _part(self, p: nn.Parameter, rows: Tensor | None) -> list[Tensor]:
        """This end's gradient part of ``p`` in its wire form (``encode_part``)."""
        g = grad_or_zeros(p)
        g = g[rows] if rows is not None else g  # (u, m) rows of an anchor table, or the whole (d, r)
        return encode_part(g.detach(), self.dtype)

    # -- checksum and resync ----------------------------------------------------------------------
    def check_post(self) -> None:
        device = self.params[0][1].device  # NCCL links carry device tensors only
        mine = torch.tensor([fingerprint([p]) for _, p, _ in self.params], dtype=torch.int64, device=device)
        spec = WireSpec(self.category, tuple(mine.shape), torch.int64)
        (theirs,), handles = self.link.exchange([Packet(self.category, mine)], [spec], self.check_tag)
        self._pending = (mine, theirs, handles)

    def check_finish(self) -> bool:
        """Compare digests; on a mismatch the receiver adopts the sender's values. True if resynced."""
        mine, theirs, handles = self._pending
        wait_all(handles)
        self._pending = None
        if torch.equal(mine, theirs):
            return False
        values = [p for _, p, _ in self.params]
        if self.role == "sender":
            wait_all(self.link.isend([Packet(self.category, p.detach()) for p in values], self.check_tag))
        else:
            bufs, handles = self.link.irecv([WireSpec(self.category, tuple(p.shape), p.dtype) for p in values],
                                            self.check_tag)
            wait_all(handles)
            with torch.no_grad():
                for p, b in zip(values, bufs, strict=True):
                    p.copy_(b)
        self.resyncs += 1
        return True


def tied_sync(params: list[tuple[str, nn.Parameter, bool | str]], role: str, link: Link,
              dtype: str = "fp32") -> SharedParamSync:
    """One end of a tied embedding/head exchange: exact fp32 parts by default, kind ``tied``, its own tags.

    fp32 whatever ``pipeline.sync_dtype`` says: the tied weight's gradient is a large part of the
    model's, and summing exact parts gives the single-process tied model's gradient (to rounding).
    ``pipeline.tied_sync_dtype`` (bf16, int8) trades that parity for 2x / ~4x fewer bytes; both ends
    still sum the same decoded parts, so the two copies stay identical.
    """
    return SharedParamSync(params, role, link, dtype, "tied", TIED_TAGS)


def run_phases(ends: list[SharedParamSync], first: str, second: str, **kwargs) -> list:
    """Call ``first`` on every end, then ``second`` on every end (senders before receivers)."""
    for e in ends:
        getattr(e, first)(**kwargs)
    order = sorted(ends, key=lambda e: e.role != "sender")
    return [getattr(e, second)() for e in order]
