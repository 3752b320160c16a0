"""One MAPL boundary step in isolation: the ``MAPL boundary step`` row of ``slimpar bench throughput``.

A boundary of ``slimpar train --pipeline.codec mapl --pipeline.compression 4 --pipeline.compression_of payload``
(r = d / 4; the CLI's factorized receiver-only anchors, ids read locally) at the bench's model width d and tokens
per step (16 x 1,024 at 134M: d = 768, r = 192; 8 x 2,048 at 1B: d = 2,048, r = 512), both halves in this process:

1. the sender's forward: c = Aᵀh and its wire message (the payload's fp32 cast);
2. the receiver decodes the message and lifts it, ĥ = Ac + E[t]P, then runs its backward from a fixed ∂L/∂ĥ:
   A's receiver part, E's rows and ∂L/∂c;
3. ∂L/∂c crosses back in its wire form and the sender's backward gives A's sender part and ∂L/∂h;
4. one optimizer step as the pipeline builds it (``pipeline.training.build_optimizer``): SPEL on A, whose gradient
   is the two parts' sum (the sum the gradient exchange installs; here both halves hold one A), AdamW on E.

So it is what a boundary adds to one step of a stage, the work of its two ranks together, without the exchange's
int8 wire form and without the stages. No communication: the message and the gradient cross as tensors.
"""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass

import torch
from torch import Tensor

from benchmarks.in_process import time_steps
from slimpar.models.llama import LlamaConfig
from slimpar.optim.spel import SPELAdamW
from slimpar.pipeline.boundary import BoundaryDecoder, BoundaryEncoder
from slimpar.pipeline.spec import CodecSpec, StageContext
from slimpar.pipeline.training import MaplTrainingSpec, build_optimizer

COMPRESSION = 4  # the payload's: r = d / 4, as the throughput bench's MAPL 4x pipeline row runs it


@dataclass
class BoundaryStep:
    """Both halves of one MAPL boundary, a batch of ids and h, and the optimizer; ``step()`` runs one boundary step
    (module docstring) and returns the sender's ∂L/∂h."""

    encoder: BoundaryEncoder
    decoder: BoundaryDecoder
    optimizer: SPELAdamW
    h: Tensor  # (b, T, d), the last block's output on the sender
    grad_out: Tensor  # (b, T, d), ∂L/∂ĥ from the receiver's stage
    autocast: bool  # bf16 autocast, as the trainer runs a GPU step

    @classmethod
    def build(cls, dim: int, vocab: int, batch: int, seq: int, device: torch.device, seed: int = 0) -> BoundaryStep:
        spec = CodecSpec.mapl(dim, COMPRESSION, vocab=vocab, seed=seed, projector_init="random")
        ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed)).to(device)
        halves = []
        for half in (BoundaryEncoder, BoundaryDecoder):
            ctx = StageContext()
            ctx.set_batch(ids, 1)  # the stage's own ids: MAPL's default reads them locally on both ends
            halves.append(half(spec, ctx).to(device))
        enc, dec = halves
        dec.projector.A = enc.projector.A  # one A: autograd sums the two ends' parts into its gradient
        opt = build_optimizer(enc, [enc.projector.A, dec.anchor.E], MaplTrainingSpec(lr=3e-4))
        g = torch.Generator().manual_seed(seed + 1)
        h = torch.randn(batch, seq, dim, generator=g).to(device).requires_grad_()
        grad_out = torch.randn(batch, seq, dim, generator=g).to(device)
        return cls(enc, dec, opt, h, grad_out, autocast=device.type == "cuda")

    def step(self) -> Tensor:
        enc, dec = self.encoder, self.decoder
        self.h.grad = None
        shape = tuple(self.h.shape[:2])
        amp = torch.autocast("cuda", dtype=torch.bfloat16) if self.autocast else contextlib.nullcontext()
        with amp:
            out = enc(self.h)  # c (b, T, r); its message in the outbox
            msg = enc.outbox.pop(0)
            act = dec.decode([p.tensor for p in msg.fixed], [p.tensor for p in msg.extra], shape)
            act = act.detach().requires_grad_()
            lifted = dec(act)  # ĥ (b, T, d)
        lifted.backward(self.grad_out)
        back = enc.decode_grad([p.tensor for p in dec.encode_grad(act.grad)])
        out.backward(back)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return self.h.grad


def boundary_row(size: str, vocab: int, batch: int, seq: int, warmup: int, steps: int, device: torch.device) -> dict:
    """The row's numbers: the median step and SPEL's part of it (seconds), aten ops of one step, CUDA's peak."""
    dim = LlamaConfig.named(size, vocab_size=vocab).dim
    bench = BoundaryStep.build(dim, vocab, batch, seq, device)
    spel = []

    def step() -> None:
        bench.step()
        spel.append(bench.optimizer.last_spel_timer)  # read after the timed steps: reading waits on CUDA

    row = time_steps(step, warmup, steps, device)
    return {**row, "spel_time_s": statistics.median(t.seconds for t in spel[warmup:warmup + steps]), "dim": dim,
            "rank": bench.encoder.spec.rank}
