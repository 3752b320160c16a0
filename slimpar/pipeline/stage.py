"""``CodecPipelineStage``: a ``torch.distributed.pipelining.PipelineStage`` that sends codec messages.

Why a subclass: ``PipelineStage`` sends each stage output as is and
receives into buffers shaped like it, so a boundary could only carry one float tensor whose gradient
has the same shape. Compressed boundaries need asymmetric messages — packed RVQ indices plus a
codebook header (and a variable tail of codebook rows) forward, r floats backward; int8 values plus
scales in both directions; token ids next to the payload — and integer stage outputs are impossible
in training (received buffers are made to require grad). So this class keeps the schedule's logic
and its float stage outputs (static metadata, no shape inference over the wire) and replaces only
what crosses the wire:

  forward   get_fwd_send_ops        sends the encoder's message for the microbatch (fixed part on tag 0
                                    in the schedule's slot, codebook tail on its own tag), counted
            get_fwd_recv_ops        posts receives for the fixed part the decoder expects
            _retrieve_recv_activations  receives the announced tail, decodes the message into the
                                    sender's float ``out`` and returns it as a fresh autograd leaf
  backward  get_bwd_send_ops        encodes ∂L/∂out with the codec's gradient format, counted
            get_bwd_recv_ops / _retrieve_recv_grads   the sender's side of the same
  forward_one_chunk                 records the microbatch index the codec halves work on

Pinned to torch 2.13: ``_retrieve_recv_activations``, ``_retrieve_recv_grads``, ``bwd_cache`` and
``args_recv_info`` are private; tests/unit/test_pipeline_validate.py checks their signatures so a
torch upgrade that changes them fails a test instead of hanging a run.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.pipelining import PipelineStage

from slimpar.pipeline.split import StageModule
from slimpar.pipeline.wire import TAG_CODEBOOK, ByteCounter, P2PLink, Packet, wait_all


class CodecPipelineStage(PipelineStage):
    """One rank's stage: ``module`` (a StageModule), microbatches of ``shape`` = (mb, T) tokens."""

    def __init__(self, module: StageModule, shape: tuple[int, int], vocab: int, device: torch.device,
                 group: dist.ProcessGroup, peers: dict[int, int], counter: ByteCounter):
        s, n = module.stage, module.num_stages
        inputs, outputs = _static_metadata(module, shape, vocab, device)
        super().__init__(module, s, n, device, input_args=inputs, output_args=outputs, group=group)
        self.module, self.shape, self.counter = module, shape, counter
        # the boundary-side links carry only the codebook tails and count this rank's sends
        self.prev = P2PLink(s - 1, "bwd", counter, peers[s - 1], group, device) if s > 0 else None
        self.next = P2PLink(s, "fwd", counter, peers[s + 1], group, device) if s < n - 1 else None
        self._fwd_wire: dict[int, list[Tensor]] = {}
        self._bwd_wire: dict[int, list[Tensor]] = {}

    # -- forward ----------------------------------------------------------------------------------
    def forward_one_chunk(self, fwd_chunk_id: int, args, kwargs=None, save_forward_output: bool = True):
        self.module.context.microbatch = fwd_chunk_id  # the codec halves stash / read by microbatch
        if self.is_first and args:  # torch 2.11 checks strides too: a slice such as data[:, :-1] is refused
            args = tuple(a.contiguous() if isinstance(a, Tensor) else a for a in args)
        return super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        if self.is_last:
            return []
        msg = self.module.encoder.outbox.pop(fwd_chunk_id)
        self.next.count(msg.fixed + msg.extra)
        return self._ops(dist.isend, msg.fixed, self.next.peer) + self._ops(
            dist.isend, msg.extra, self.next.peer, TAG_CODEBOOK)

    def get_fwd_recv_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        if self.is_first:
            return []
        bufs = [spec.empty(self.device) for spec in self.module.decoder.fixed_spec(self.shape)]
        self._fwd_wire[fwd_chunk_id] = bufs
        return self._ops(dist.irecv, [Packet("payload", b) for b in bufs], self.prev.peer)

    def _retrieve_recv_activations(self, fwd_chunk_id: int) -> tuple[Tensor, ...]:
        dec = self.module.decoder
        fixed = self._fwd_wire.pop(fwd_chunk_id)
        extra, handles = self.prev.irecv(dec.extra_spec(fixed), TAG_CODEBOOK)
        wait_all(handles)
        act = dec.decode(fixed, extra, self.shape).detach()  # (mb, T, w): the sender's out
        act.requires_grad_(self.has_backward and torch.is_grad_enabled())
        self.args_recv_info[fwd_chunk_id][0].buffer = act  # the schedule clears .grad of this leaf
        return (act,)

    # -- backward ---------------------------------------------------------------------------------
    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        if not self.has_backward or self.is_first:
            return []
        self._check_chunk_id(bwd_chunk_id)
        (grad,) = self.bwd_cache.pop(bwd_chunk_id)[:1]
        if grad is None:  # the stage did not use its input: send zeros of the agreed shape
            grad = torch.zeros(*self.shape, self.module.decoder.spec.width, device=self.device)
        packets = self.module.decoder.encode_grad(grad)
        self.prev.count(packets)
        return self._ops(dist.isend, packets, self.prev.peer)

    def get_bwd_recv_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        if not self.has_backward or self.is_last:
            return []
        bufs = [spec.empty(self.device) for spec in self.module.encoder.grad_spec(self.shape)]
        self._bwd_wire[bwd_chunk_id] = bufs
        return self._ops(dist.irecv, [Packet("payload", b) for b in bufs], self.next.peer)

    def _retrieve_recv_grads(self, bwd_chunk_id: int) -> tuple[Tensor, ...]:
        return (self.module.encoder.decode_grad(self._bwd_wire.pop(bwd_chunk_id)),)

    def _ops(self, op, packets: list[Packet], peer: int, tag: int = 0) -> list[dist.P2POp]:
        return [dist.P2POp(op, p.tensor.contiguous(), peer, self.group, tag) for p in packets]


def _static_metadata(module: StageModule, shape: tuple[int, int], vocab: int,
                     device: torch.device) -> tuple[Tensor, Tensor]:
    """Example input and output of the stage: with both given, PipelineStage skips shape inference.

    Inputs: token ids on stage 0, else the decoded float ``out`` (mb, T, w). Outputs: the encoder's
    ``out`` (mb, T, w), or logits (mb, T, V) on the last stage. Only shapes and dtypes are read.
    """
    if module.decoder is None:
        inputs = torch.zeros(*shape, dtype=torch.int64, device=device)
    else:
        inputs = torch.empty(*shape, module.decoder.spec.width, device=device, requires_grad=True)
    width = vocab if module.encoder is None else module.encoder.spec.width
    outputs = torch.empty(*shape, width, device=device, requires_grad=True)
    return inputs, outputs
