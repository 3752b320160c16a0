"""The two halves of a boundary codec: ``BoundaryEncoder`` ends stage p, ``BoundaryDecoder`` starts p + 1.

Forward (docs/methods.md, 'Stiefel projector', 'Factorized anchors' and
'Residual vector quantization'). The encoder maps the residual stream h (mb, T, d) to the
float tensor ``out`` (mb, T, w) whose gradient comes back, and leaves the wire message for the
current microbatch in ``outbox``:
  none   out = h                              payload h as float32            (w = d)
  bf16   out = h rounded through bf16         payload bf16                    (w = d)
  int8   out = per-token int8 round trip      payload int8 values + fp32 scale per token
  mapl   out = c = Aᵀ(h − o(t))               payload c as float32            (w = r)
  naive  out = c = (h − o(t)) D               payload c as float32
  ssn    out = c = Uᵀ(h − F[t])               payload c as float32
(each kind's projector and wire cast come from its entry in codec_kinds.CODEC_KINDS)
with RVQ (projector codecs) ``out`` = the quantized codes q (straight-through to c), the payload is
the packed indices (Q·⌈log₂K⌉ bits per token) plus a codebook header, and the changed codebook rows
follow as a variable tail. Token ids join the payload when the codec needs them and they are sent.
The decoder rebuilds exactly ``out`` from the message (bit for bit: same casts, same codebook rows)
and its forward maps it back to the residual stream: ĥ = up(out) + o(t).

Backward: the decoder receives ∂L/∂out (mb, T, w) from autograd and ``grad_packets`` encodes it for
the wire (float32 w numbers per token; bf16 / int8 for the cast codecs); the encoder decodes it with
``grad_decode`` and autograd carries it into the stage. An RVQ commitment loss is injected on the
sender through ``inject_loss``, since only the last stage of a pipeline has a loss.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from slimpar.codecs.anchors import FactorizedAnchor, FixedTokenTable, build_anchor
from slimpar.codecs.codebook_sync import (
    HEADER_DTYPE,
    HEADER_NUMEL,
    CodebookReceiver,
    CodebookSender,
    SyncMessage,
)
from slimpar.codecs.packing import bits_for, ids_to_payload, pack_indices, packed_nbytes, payload_to_ids, unpack_indices
from slimpar.codecs.projector import StiefelProjector
from slimpar.codecs.rvq import ResidualVQ
from slimpar.parallel.device import to_device
from slimpar.pipeline.spec import WHOLE_BATCH, CodecSpec, StageContext
from slimpar.pipeline.wire import Message, Packet, WireSpec, split_batch, split_packets

# a codebook change where the sender's schedule has none: the two ends' rvq settings or microbatches differ
_UNEXPECTED = ("a codebook header between two steps' first microbatches was not 'none' at the version held: the "
               "sender changed its codebook where its schedule says it does not")


class _InjectLoss(torch.autograd.Function):
    """Identity on x; in backward, ``aux`` (a scalar loss term) also receives gradient 1."""

    @staticmethod
    def forward(ctx, x: Tensor, aux: Tensor) -> Tensor:
        ctx.aux_shape = aux.shape
        return x.clone()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:
        return grad, torch.ones(ctx.aux_shape, dtype=grad.dtype, device=grad.device)


def inject_loss(x: Tensor, aux: Tensor) -> Tensor:
    """x in forward; backward adds ∂aux/∂(inputs of aux) as if aux were added to the final loss."""
    return _InjectLoss.apply(x, aux)


def build_projector(spec: CodecSpec, role: str, ssn_basis: Tensor | None = None) -> nn.Module | None:
    build = spec.codec.projector
    if build is None:
        return None
    return build(spec.dim, spec.rank, spec.seed, spec.boundary, spec.identity_init, role, ssn_basis)


def _anchor(spec: CodecSpec, role: str, embedding: Tensor | None, ssn_table: Tensor | None) -> nn.Module | None:
    if spec.codec.token_table:
        return FixedTokenTable(ssn_table)
    if spec.anchors == "none" or (role == "sender" and not spec.shares_anchor):
        return None
    start = embedding if spec.anchor_start_embedding else None  # receiver-only form / anchor_init zero: zero
    return build_anchor(spec.anchors, spec.vocab, spec.dim, spec.anchor_dim, spec.seed, spec.boundary, start)


def grad_packets(spec: CodecSpec, g: Tensor) -> list[Packet]:
    """∂L/∂out (mb, T, w) as it crosses backward: float32, or the cast codecs' wire format."""
    return spec.codec.cast.packets(g)


def grad_specs(spec: CodecSpec, shape: tuple[int, int]) -> list[WireSpec]:
    return spec.codec.cast.specs(shape, spec.width)


def grad_decode(spec: CodecSpec, tensors: list[Tensor]) -> Tensor:
    return spec.codec.cast.decode(tensors)


class _Half(nn.Module):
    """What both halves share: the spec, the stage context and the parameters both ends hold."""

    def __init__(self, spec: CodecSpec, context: StageContext):
        super().__init__()
        self.spec = spec
        self.context = context

    def shared_parameters(self) -> list[tuple[str, nn.Parameter, bool]]:
        """(name, parameter, sparse rows) of every parameter the other end holds a copy of, in a fixed order."""
        out = []
        proj = getattr(self, "projector", None)
        if isinstance(proj, StiefelProjector):
            out.append(("projector.A", proj.A, False))
        anchor = getattr(self, "anchor", None)
        if self.spec.shares_anchor and anchor is not None:
            out.append(("anchor.E", anchor.E, True))
        return out


class BoundaryEncoder(_Half):
    """Sender half of boundary p (the end of stage p)."""

    def __init__(self, spec: CodecSpec, context: StageContext, embedding: Tensor | None = None,
                 ssn: tuple[Tensor, Tensor] | None = None):
        super().__init__(spec, context)
        self.projector = build_projector(spec, "sender", ssn[0] if ssn else None)
        self.anchor = _anchor(spec, "sender", embedding, ssn[1] if ssn else None)
        self.rvq = self.codebook = None
        if spec.rvq is not None:
            q = spec.rvq
            self.rvq = ResidualVQ(spec.rank, q.levels, q.codebook, q.decay, q.commitment,
                                  dead_threshold=q.dead_threshold, seed=spec.seed * 1009 + spec.boundary,
                                  update_every=max(1, q.update_every * spec.microbatches))
            self.codebook = CodebookSender(self.rvq, full_every=q.sync_every * spec.microbatches)
        self.outbox: dict[int, Message] = {}
        self.messages = 0  # training messages sent: paces the full codebook pushes
        self._none_header: tuple[tuple, Tensor] | None = None  # ((version, base, device), a "none" header there)

    def forward(self, h: Tensor) -> Tensor:
        """h (mb, T, d) -> out (mb, T, w); the wire message goes to ``outbox[context.microbatch]``.

        For the whole batch of a one-pass step (``context.microbatch`` is ``WHOLE_BATCH``, h (b, T, d)), the
        messages of its M microbatches go to ``outbox[0..M−1]``, each what the microbatch's forward would send."""
        whole = self.context.microbatch == WHOLE_BATCH
        parts = self.context.microbatches if whole else 1
        ids = self.context.current_ids() if self.spec.needs_ids else None
        out, msgs = self._encode(self.project(h, ids), parts)
        if self.spec.sends_ids:
            for msg, part in zip(msgs, split_batch(_ids_to_wire(ids, self.spec.ids_dtype), parts), strict=True):
                msg.fixed.append(Packet("ids", part))
        for m, msg in zip(range(parts) if whole else [self.context.microbatch], msgs, strict=True):
            self.outbox[m] = msg
        return out

    def project(self, h: Tensor, ids: Tensor | None) -> Tensor:
        """x = Aᵀ(h − o(t)) (mb, T, w): the anchor taken off, the projection down; pure tensor math, the region
        :func:`compile_codecs` compiles."""
        x = h - self.anchor(ids) if self.anchor is not None else h
        return self.projector.down(x) if self.projector is not None else x

    def _encode(self, x: Tensor, parts: int) -> tuple[Tensor, list[Message]]:
        if self.rvq is not None:
            return self._quantize(x, parts)
        out, packets = self.spec.codec.cast.encode(x)
        return out, [Message(p) for p in split_packets(packets, parts)]

    def _quantize(self, c: Tensor, parts: int) -> tuple[Tensor, list[Message]]:
        q, idx, commit = self.rvq(c, windows=parts)  # (mb, T, r), (mb, T, Q), scalar
        msgs = [Message([Packet("payload", packed)]) for packed in _packed_parts(idx, bits_for(self.spec.rvq.codebook),
                                                                                 parts)]
        if self.training:
            for msg in msgs:  # a message per forward: the first of a step may bring rows, the others are "none"
                sync = self.codebook.message(self.messages)
                self.messages += 1
                header, tail = self._header_of(sync, c.device)
                msg.fixed.append(Packet("codebook", header))
                msg.extra = [Packet("codebook", t) for t in tail]
            if self.spec.rvq.commitment > 0 and torch.is_grad_enabled():
                q = inject_loss(q, commit)
        return q, msgs

    def _header_of(self, sync: SyncMessage, device: torch.device) -> tuple[Tensor, list[Tensor]]:
        """A sync message's header on ``device`` (made on the host: no wait) and its tail. A "none" message's header
        is the same for every message at a version, so it is made once and sent again (nothing writes a sent
        tensor): a host tensor and a copy to the device fewer per microbatch."""
        if sync.kind != "none":
            header, *tail = sync.to_tensors()
            return to_device(header, device), tail
        key = (sync.version, sync.base_version, device)
        if self._none_header is None or self._none_header[0] != key:
            self._none_header = (key, to_device(sync.to_tensors()[0], device))
        return self._none_header[1], []

    def decode_grad(self, tensors: list[Tensor]) -> Tensor:
        return grad_decode(self.spec, tensors)

    def grad_spec(self, shape: tuple[int, int]) -> list[WireSpec]:
        return grad_specs(self.spec, shape)


class BoundaryDecoder(_Half):
    """Receiver half of boundary p (the start of stage p + 1)."""

    def __init__(self, spec: CodecSpec, context: StageContext, embedding: Tensor | None = None,
                 ssn: tuple[Tensor, Tensor] | None = None):
        super().__init__(spec, context)
        self.projector = build_projector(spec, "receiver", ssn[0] if ssn else None)
        self.anchor = _anchor(spec, "receiver", embedding, ssn[1] if ssn else None)
        self.codebook = None
        if spec.rvq is not None:
            self.codebook = CodebookReceiver(spec.rank, spec.rvq.levels, spec.rvq.codebook)
        self._header: list[int] | None = None  # the codebook header read for the microbatch being received
        self._want: tuple[tuple, Tensor] | None = None  # ((version, device, dtype), the "none" header expected)

    def fixed_spec(self, shape: tuple[int, int]) -> list[WireSpec]:
        """Shapes of a message's fixed part for a (mb, T) microbatch, in wire order."""
        s = self.spec
        if s.rvq is not None:
            n = shape[0] * shape[1] * s.rvq.levels
            out = [WireSpec("payload", (packed_nbytes(n, bits_for(s.rvq.codebook)),), torch.uint8)]
            if self.training:
                out.append(WireSpec("codebook", (HEADER_NUMEL,), HEADER_DTYPE))
        else:
            out = s.codec.cast.specs(shape, s.width)
        if s.sends_ids:
            out.append(WireSpec("ids", shape, s.ids_dtype))
        return out

    def reads_header(self) -> bool:
        """Whether this microbatch's codebook header is read on the host.

        The sender changes its codebook only at the first forward of a step (an EMA update every
        ``rvq.update_every`` steps, a full table every ``rvq.sync_every`` steps: whole steps of forwards, counted
        from the first), so only a step's first microbatch can bring rows; the others carry "none". Reading a
        header makes a GPU wait, so the others are checked on the device instead (:meth:`_expect_none`, an
        assertion the device raises without the host waiting). ``rvq.update_every`` 0 (an update every
        microbatch) reads them all."""
        return self.spec.rvq.update_every == 0 or self.context.microbatch == 0

    def extra_spec(self, fixed: list[Tensor]) -> list[WireSpec]:
        """Shapes of the variable tail announced by a received fixed part (codebook rows)."""
        self._header = None
        if self.spec.rvq is None or not self.training or not self.reads_header():
            return []
        self._read_header(fixed[1])
        num_rows = self.spec.rvq.levels * self.spec.rvq.codebook
        return [WireSpec("codebook", shape, dtype)
                for shape, dtype in SyncMessage.payload_specs(self._header, num_rows, self.spec.rank)]

    def _read_header(self, header: Tensor) -> None:
        self._header = header.tolist()  # the one wait, once per step

    def _expect_none(self, header: Tensor) -> None:
        """Assert on the device that an unread header (or a stack of them) is "none" at the version this end holds
        (the header it expects is made once per version: three calls a step, not ten)."""
        key = (self.codebook.version, header.device, header.dtype)
        if self._want is None or self._want[0] != key:
            want = torch.zeros(HEADER_NUMEL, dtype=header.dtype, device=header.device)
            want[0] = want[1] = self.codebook.version
            self._want = (key, want)
        torch._assert_async((header == self._want[1]).all(), _UNEXPECTED)

    def decode(self, fixed: list[Tensor], extra: list[Tensor], shape: tuple[int, int]) -> Tensor:
        """The sender's ``out`` (mb, T, w) from a received message; received ids go to the context."""
        s = self.spec
        if s.sends_ids:
            self.context.ids[self.context.microbatch] = _wire_to_ids(fixed[-1])
        if s.rvq is not None:
            version = self._sync_codebook(fixed, extra)
            idx = unpack_indices(fixed[0], bits_for(s.rvq.codebook), (*shape, s.rvq.levels))
            return self.codebook.decode(idx, version)  # (mb, T, r): the sender's q, bit for bit
        return s.codec.cast.decode(fixed)

    def decode_parts(self, messages: list[tuple[list[Tensor], list[Tensor]]], shape: tuple[int, int]) -> Tensor:
        """The sender's ``out`` (b, T, w) of a one-pass step from its M microbatches' messages (fixed, extra), each
        (mb, T) = ``shape``, read in order as the schedule reads them; an RVQ's indices unpacked and decoded once."""
        if self.spec.rvq is None:
            parts = []
            for m, (fixed, extra) in enumerate(messages):
                self.context.microbatch = m
                parts.append(self.decode(fixed, extra, shape))
            return torch.cat(parts) if len(parts) > 1 else parts[0]
        s, versions, unread = self.spec, set(), []
        for m, (fixed, extra) in enumerate(messages):
            self.context.microbatch = m
            if s.sends_ids:
                self.context.ids[m] = _wire_to_ids(fixed[-1])
            versions.add(self._sync_codebook(fixed, extra, unread))
        if unread:
            self._expect_none(torch.stack(unread))  # one device-side check for the step's unread headers
        (version,) = versions  # a step's microbatches are quantized with one codebook (virtual.one_pass_blocker)
        bits, levels = bits_for(s.rvq.codebook), s.rvq.levels
        whole = (len(messages) * shape[0], shape[1], levels)
        if shape[0] * shape[1] * levels * bits % 8 == 0:  # each part's stream ends on a byte: one stream
            idx = unpack_indices(torch.cat([fixed[0] for fixed, _ in messages]), bits, whole)
        else:
            idx = torch.cat([unpack_indices(fixed[0], bits, (*shape, levels)) for fixed, _ in messages])
        return self.codebook.decode(idx, version)  # (b, T, r)

    def _sync_codebook(self, fixed: list[Tensor], extra: list[Tensor], unread: list[Tensor] | None = None) -> int:
        """Apply a training message's codebook header (and rows) for the current microbatch; the version to decode
        its indices with. A header not read on the host is checked on the device, or left in ``unread`` to check."""
        s = self.spec
        if self.codebook.codebooks.device != fixed[0].device:  # not a buffer: follow the wire's device
            self.codebook.codebooks = self.codebook.codebooks.to(fixed[0].device)
        version = self.codebook.version
        if self.training and self._header is None and self.reads_header():  # the caller skipped extra_spec
            self._read_header(fixed[1])
        if self.training and self._header is None and unread is not None:  # not read on the host: "none" by the
            unread.append(fixed[1])  # schedule, checked by the caller with the step's others
        elif self.training and self._header is None:
            self._expect_none(fixed[1])
        elif self.training:
            msg = SyncMessage.from_tensors([fixed[1], *extra], s.rvq.levels * s.rvq.codebook, s.rank,
                                           header_values=self._header)
            self.codebook.apply(msg)
            version = msg.version
            self._header = None
        return version

    def forward(self, act: Tensor) -> Tensor:
        """out (mb, T, w) -> ĥ (mb, T, d) = up(out) + o(t)."""
        return self.lift(act, self.context.current_ids() if self.anchor is not None else None)

    def lift(self, act: Tensor, ids: Tensor | None) -> Tensor:
        """ĥ = A out + o(t): pure tensor math, the region :func:`compile_codecs` compiles."""
        if isinstance(self.projector, StiefelProjector) and isinstance(self.anchor, FactorizedAnchor):
            return self.projector.up(act, (self.anchor.E, self.anchor.P, ids))  # the anchor in A's node
        h = self.projector.up(act) if self.projector is not None else act
        return h + self.anchor(ids) if self.anchor is not None else h

    def encode_grad(self, g: Tensor) -> list[Packet]:
        return grad_packets(self.spec, g)


def _packed_parts(idx: Tensor, bits: int, parts: int) -> list[Tensor]:
    """The packed indices of each of ``parts`` equal microbatches of idx (b, T, Q): one packing of the whole, cut
    at the parts' bytes, where every part ends on a byte boundary (then the streams are the same bytes)."""
    if parts > 1 and idx[0].numel() * (idx.shape[0] // parts) * bits % 8 == 0:
        return split_batch(pack_indices(idx, bits, check=False), parts)
    return [pack_indices(i, bits, check=False) for i in split_batch(idx, parts)]


def _ids_to_wire(ids: Tensor, dtype: torch.dtype) -> Tensor:
    return ids_to_payload(ids, check=False) if dtype == torch.int16 else ids.to(torch.int32)


def _wire_to_ids(t: Tensor) -> Tensor:
    return payload_to_ids(t) if t.dtype == torch.int16 else t.to(torch.int64)


def compile_codecs(codecs: nn.ModuleDict, backend: str = "inductor") -> None:
    """Compile each boundary half's tensor math in place (``torch.compile``, static shapes): the encoder's
    :meth:`BoundaryEncoder.project` and the decoder's :meth:`BoundaryDecoder.lift`, so the anchor's gather, its
    subtraction or addition and the projection become one region with its own backward graph. What stays eager
    is what moves bytes or reads the host: the wire cast or RVQ, the message bookkeeping, the codebook sync.
    Halves without a projector or an anchor have no math to compile."""
    for half in codecs.values():
        if half.projector is None and half.anchor is None:
            continue
        name = "project" if isinstance(half, BoundaryEncoder) else "lift"
        setattr(half, name, torch.compile(getattr(half, name), backend=backend, dynamic=False))
