"""The virtual pipeline: every stage and codec of a pipeline in one process, no process group.

It runs the same ``StageModule``s and boundary messages as the distributed pipeline, through
``LocalLink``s that count bytes at the send exactly like the P2P links. Per step (microbatches m in
order, as both GPipe and 1F1B run them on every stage):

  forward   stage s runs microbatch m; its encoder's message goes through link s; stage s + 1
            decodes it into a fresh leaf (the sender's ``out``, bit for bit)
  backward  the loss of m is backpropagated through the last stage; each decoder encodes ∂L/∂out for
            the wire, the encoder decodes it and autograd continues into the previous stage
  then      parameter gradients / M (the schedule's ``scale_grads``) and the shared-parameter
            exchange of every boundary (sync.py), and of a tied embedding and head between stage 0
            and stage P − 1 (its own local link, counted as boundary P − 1, kind ``tied``).

Parameter gradients accumulate over microbatches in the same order as on a real pipeline, so a
virtual run and a P-process run of the same config agree to rounding.

One pass (the default, ``microbatched=False``): the same step with the whole batch through every stage
once, so a step costs the ops of one model's step, not M of them. The loss is the mean over the batch
(the mean of the M microbatches' means: equal microbatches), so the gradients are the schedule's sum / M
without a division; every boundary still sends M messages each way, each the one its microbatch would
send (the same bytes, headers and codebook messages), and decodes them into the whole batch. RVQ learns
from the whole batch as from its M forwards (``ResidualVQ(..., windows=M)``). Where one pass is not
the same step (``one_pass_blocker``: an RVQ that updates its codebook after every microbatch, or a
registered codec's own wire cast, which need not act token by token), or the
batch does not split into M equal microbatches, the step runs microbatch by microbatch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from slimpar.pipeline.codec_kinds import Bf16Cast, Int8Cast, WireCast
from slimpar.pipeline.spec import WHOLE_BATCH
from slimpar.pipeline.split import StageModule
from slimpar.pipeline.sync import SharedParamSync, run_phases, tied_sync
from slimpar.pipeline.sync_local import exchange_local
from slimpar.pipeline.wire import ByteCounter, LocalLink, recv_message, send_message, split_packets, wait_all

# the wire casts whose packets hold one entry per token (or sequence): a batch's packets split into its microbatches'
PER_TOKEN_CASTS = (WireCast, Bf16Cast, Int8Cast)


def one_pass_blocker(stages: list[StageModule]) -> str | None:
    """Why one pass over the whole batch would not be the microbatched schedule's step; None when it is."""
    for stage in stages:
        enc = stage.encoder
        if enc is None:
            continue
        if enc.rvq is not None and enc.spec.rvq.update_every == 0:
            return (f"boundary {stage.stage}'s RVQ updates its codebook after every microbatch (rvq.update_every = 0), "
                    "so each microbatch is quantized with another codebook")
        if enc.rvq is None and type(enc.spec.codec.cast) not in PER_TOKEN_CASTS:
            return (f"boundary {stage.stage}'s codec {enc.spec.kind!r} has a wire cast of its own, which may not act "
                    "token by token, so a batch's message need not be its microbatches' messages")
    return None


class VirtualPipeline:
    """``stages`` (all P of them) connected by local links; ``loss_fn(logits, y)`` per microbatch."""

    def __init__(self, stages: list[StageModule], counter: ByteCounter, loss_fn, sync_dtype: str = "int8",
                 tied_dtype: str = "fp32", microbatched: bool = False):
        self.stages, self.counter, self.loss_fn = stages, counter, loss_fn
        # why a one-pass step would not be the same step (then every step runs microbatch by microbatch)
        self.fallback = None if microbatched else one_pass_blocker(stages)
        self.one_pass = not microbatched and self.fallback is None
        device = next(stages[0].parameters()).device
        self.links = [LocalLink.pair(p, counter, device) for p in range(len(stages) - 1)]  # (sender, receiver)
        self.syncs: list[tuple[SharedParamSync, SharedParamSync]] = []
        for p in range(len(stages) - 1):
            enc, dec = stages[p].encoder, stages[p + 1].decoder
            if enc.shared_parameters():
                self.syncs.append((SharedParamSync(enc.shared_parameters(), "sender", self.links[p][0], sync_dtype),
                                   SharedParamSync(dec.shared_parameters(), "receiver", self.links[p][1], sync_dtype)))
        if stages[0].tied_parameters():  # exact fp32 parts by default, whatever sync_dtype says (docs/pipeline.md)
            first, last = LocalLink.pair(len(stages) - 1, counter, device)
            self.syncs.append((tied_sync(stages[0].tied_parameters(), "sender", first, tied_dtype),
                               tied_sync(stages[-1].tied_parameters(), "receiver", last, tied_dtype)))

    def set_batch(self, x: Tensor, microbatches: int, host: Tensor | None = None) -> None:
        """Stage 0 always knows the ids; the others read them locally unless they arrive on the wire
        (``host``: the batch's ids on the host, where the caller has them)."""
        for s, stage in enumerate(self.stages):
            if s == 0 or not (stage.decoder is not None and stage.decoder.spec.sends_ids):
                stage.context.set_batch(x, microbatches, host)
            else:  # the ids arrive with the messages
                stage.context.microbatches, stage.context.batch_ids = microbatches, None

    def step(self, x: Tensor, y: Tensor, microbatches: int, host: Tensor | None = None) -> Tensor:
        """Forward and backward of one (b, T) batch in ``microbatches`` microbatches; the mean loss as a float64
        scalar on the device (not read here: reading it would make a GPU wait). ``host``: ``x`` on the host."""
        self.set_batch(x, microbatches, host)
        if self.one_pass and x.shape[0] % microbatches == 0:
            loss = self._whole_batch(x, y, microbatches)
            self.exchange_shared_grads()
            return loss.double()
        losses = [self._microbatch(m, xm, ym) for m, (xm, ym) in
                  enumerate(zip(torch.tensor_split(x, microbatches), torch.tensor_split(y, microbatches),
                                strict=True))]
        for stage in self.stages:
            for p in stage.parameters():
                if p.grad is not None:
                    p.grad.div_(microbatches)
        self.exchange_shared_grads()
        return torch.stack(losses).detach().mean().double()

    def _microbatch(self, m: int, x: Tensor, y: Tensor) -> Tensor:
        outs, leaves, inp = [], [], x
        shape = tuple(x.shape)
        for s, stage in enumerate(self.stages):
            stage.context.microbatch = m
            if s > 0:
                inp = self.receive(s - 1, shape).requires_grad_(torch.is_grad_enabled())
            leaves.append(inp)
            outs.append(stage(inp))
            if stage.encoder is not None:
                wait_all(send_message(self.links[s][0], stage.encoder.outbox.pop(m)))
        loss = self.loss_fn(outs[-1], y)
        loss.backward()
        for s in range(len(self.stages) - 1, 0, -1):
            self.links[s - 1][1].isend(self.stages[s].decoder.encode_grad(leaves[s].grad), 0)
            enc = self.stages[s - 1].encoder
            bufs, handles = self.links[s - 1][0].irecv(enc.grad_spec(shape), 0)
            wait_all(handles)
            torch.autograd.backward(outs[s - 1], enc.decode_grad(bufs))
        return loss.detach()

    def _whole_batch(self, x: Tensor, y: Tensor, parts: int) -> Tensor:
        """Forward and backward of the (b, T) batch in one pass; each boundary's traffic as ``parts`` microbatches'
        messages (module docstring). Returns the batch's mean loss, detached."""
        outs, leaves, inp = [], [], x
        shape = (x.shape[0] // parts, x.shape[1])  # one microbatch's (mb, T)
        for s, stage in enumerate(self.stages):
            if s > 0:
                inp = self.receive_whole(s - 1, shape, parts).requires_grad_(torch.is_grad_enabled())
            stage.context.microbatch = WHOLE_BATCH
            leaves.append(inp)
            outs.append(stage(inp))
            if stage.encoder is not None:
                for m in range(parts):
                    wait_all(send_message(self.links[s][0], stage.encoder.outbox.pop(m)))
        loss = self.loss_fn(outs[-1], y)
        loss.backward()
        for s in range(len(self.stages) - 1, 0, -1):
            for packets in split_packets(self.stages[s].decoder.encode_grad(leaves[s].grad), parts):
                self.links[s - 1][1].isend(packets, 0)
            enc, grads = self.stages[s - 1].encoder, []
            for _ in range(parts):
                bufs, handles = self.links[s - 1][0].irecv(enc.grad_spec(shape), 0)
                wait_all(handles)
                grads.append(enc.decode_grad(bufs))
            torch.autograd.backward(outs[s - 1], torch.cat(grads) if parts > 1 else grads[0])
        return loss.detach()

    def receive_whole(self, boundary: int, shape: tuple[int, int], parts: int) -> Tensor:
        """Decode boundary ``boundary``'s next ``parts`` messages ((mb, T) each) into one detached (b, T, w) tensor."""
        dec, messages = self.stages[boundary + 1].decoder, []
        for m in range(parts):
            dec.context.microbatch = m  # the decoder reads the microbatch's header and ids as the schedule's would
            messages.append(recv_message(self.links[boundary][1], dec, shape))
        return dec.decode_parts(messages, shape).detach()

    def receive(self, boundary: int, shape: tuple[int, int]) -> Tensor:
        """Decode boundary ``boundary``'s next message into a detached (mb, T, w) tensor."""
        dec = self.stages[boundary + 1].decoder
        fixed, extra = recv_message(self.links[boundary][1], dec, shape)
        return dec.decode(fixed, extra, shape).detach()

    def exchange_shared_grads(self) -> None:
        """Every boundary's (and a tied weight's) gradient exchange, both ends here (sync_local.py)."""
        if self.syncs:
            exchange_local(self.syncs, self.stages[0].context.touched_rows())

    def check_shared(self) -> int:
        """Checksum every boundary's shared parameters; returns how many boundaries were resynced."""
        ends = [e for pair in self.syncs for e in pair]
        return sum(run_phases(ends, "check_post", "check_finish")) // 2 if ends else 0


def load_codec_state(stages: list[StageModule], state: dict[str, torch.Tensor]) -> None:
    """Load a run export's codec tensors (``codecs.*`` without the prefix: ``send{s}.*``, ``recv{s}.*``) into
    all P ``stages``, ready to evaluate.

    An export holds tensors only: an RVQ's counters (its extra state) are not in it, and a receiver's codebook
    copy is no module state. The trained codebooks are, so every RVQ is marked initialised and each receiver's
    copy is set to its sender's codebooks, which is what the last training message left it holding.
    """
    for stage in stages:
        mine = {k: v for k, v in state.items() if k.split(".", 1)[0] in stage.codecs}
        built = stage.codecs.state_dict()
        shapes = [f"{k}: saved {tuple(v.shape)}, built {tuple(built[k].shape)}" for k, v in mine.items()
                  if k in built and isinstance(v, torch.Tensor) and v.shape != built[k].shape]
        if shapes:
            raise ValueError(f"stage {stage.stage}: codec state does not fit this run's codecs: {'; '.join(shapes)}")
        missing, unexpected = stage.codecs.load_state_dict(mine, strict=False)
        wrong = [k for k in missing if not k.endswith("_extra_state")] + list(unexpected)
        if wrong:
            raise ValueError(f"stage {stage.stage}: codec state does not fit this run's codecs: {wrong}")
    for enc, dec in ((a.encoder, b.decoder) for a, b in zip(stages[:-1], stages[1:], strict=True)):
        if enc is not None and enc.rvq is not None:
            enc.rvq.initialized = True
            dec.codebook.codebooks = enc.rvq.codebooks.detach().to(dec.codebook.codebooks.dtype, copy=True)
            dec.codebook.version = enc.rvq.version
