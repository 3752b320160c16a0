"""Cut a LLaMA into pipeline stages and wrap each with its boundary codec halves.

A stage is the full model with the other stages' blocks deleted (blocks live in a ModuleDict keyed
"0".."L−1", so parameter names stay those of the full model); only stage 0 keeps the token embedding
and only the last keeps the final norm and head. ``StageModule`` runs
    [decoder of boundary s−1] → blocks of stage s → [encoder of boundary s]
and its codec halves are named ``codecs.recv{s−1}`` / ``codecs.send{s}``, so the two copies of a
shared parameter have different names on the two ranks (checkpoints keep both, never merge them).

A model with tied embeddings keeps its tie across the cut: stage 0's ``tok_embeddings.weight`` and the
last stage's ``output.weight`` are two copies of one weight (``StageModule.tied``), kept identical by
summing their gradient parts every step (sync.py, ``tied_parameters``).
"""

from __future__ import annotations

import copy

from torch import Tensor, nn

from slimpar.pipeline.boundary import BoundaryDecoder, BoundaryEncoder
from slimpar.pipeline.spec import CodecSpec, StageContext
from slimpar.pipeline.ssn import apply_ssn, ssn_std, ssn_tensors
from slimpar.pipeline.sync import SENDER_ROWS


def stage_ranges(n_layers: int, stages: int) -> list[range]:
    """Contiguous, balanced block ranges: the first ``n_layers % stages`` stages get one block more."""
    if not 1 <= stages <= n_layers:
        raise ValueError(f"need 1 <= stages <= blocks, got {stages} stages for {n_layers} blocks")
    base, extra = divmod(n_layers, stages)
    out, start = [], 0
    for s in range(stages):
        size = base + (1 if s < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def prune_to_stage(model: nn.Module, stage: int, stages: int) -> nn.Module:
    """Delete (in place) everything of ``model`` that stage ``stage`` of ``stages`` does not run."""
    keep = {str(i) for i in stage_ranges(len(model.layers), stages)[stage]}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if stage > 0:
        model.tok_embeddings = None
    if stage < stages - 1:
        model.norm = None
        model.output = None
    return model


class StageModule(nn.Module):
    """One pipeline stage with its codec halves; ``forward`` takes tokens (stage 0) or the received
    float tensor, and returns the encoder's ``out`` (or logits on the last stage)."""

    def __init__(self, model: nn.Module, stage: int, num_stages: int, context: StageContext,
                 decoder: BoundaryDecoder | None = None, encoder: BoundaryEncoder | None = None,
                 tied: bool = False):
        super().__init__()
        self.model = model
        self.stage, self.num_stages, self.context = stage, num_stages, context
        self.tied = tied  # the full model tied its embedding and head (held by stages 0 and P − 1)
        self.codecs = nn.ModuleDict()
        if decoder is not None:
            self.codecs[f"recv{stage - 1}"] = decoder
        if encoder is not None:
            self.codecs[f"send{stage}"] = encoder

    @property
    def decoder(self) -> BoundaryDecoder | None:
        return self.codecs[f"recv{self.stage - 1}"] if f"recv{self.stage - 1}" in self.codecs else None

    @property
    def encoder(self) -> BoundaryEncoder | None:
        return self.codecs[f"send{self.stage}"] if f"send{self.stage}" in self.codecs else None

    def tied_parameters(self) -> list[tuple[str, nn.Parameter, bool | str]]:
        """This stage's copy of a tied embedding/head weight as a shared-parameter entry (sync.py); [] if none.

        Stage 0 (the embedding, the "sender" end) and stage P − 1 (the head, the "receiver" end) hold
        one each; the embedding's gradient part lives on the step's distinct ids only (SENDER_ROWS).
        """
        if not self.tied:
            return []
        if self.stage == 0:
            return [("tied.weight", self.model.tok_embeddings.weight, SENDER_ROWS)]
        if self.stage == self.num_stages - 1:
            return [("tied.weight", self.model.output.weight, SENDER_ROWS)]
        return []

    def forward(self, x: Tensor) -> Tensor:
        dec, enc = self.decoder, self.encoder
        h = dec(x) if dec is not None else x  # (mb, T, d), or token ids on stage 0
        out = self.model(h)  # (mb, T, d), or logits (mb, T, V) on the last stage
        return enc(out) if enc is not None else out


def untied(model: nn.Module) -> bool:
    out, emb = getattr(model, "output", None), getattr(model, "tok_embeddings", None)
    return out is None or emb is None or out.weight is not emb.weight


def build_stages(model: nn.Module, stages: int, which: list[int], specs: list[CodecSpec],
                 ssn_rank: int = 0) -> list[StageModule]:
    """Stage modules ``which`` of a full Llama (the model itself is consumed when one stage is built).

    Anchors start from the model's initial token embedding and, for SSN (``ssn_rank`` = k > 0), the
    whole model is reparametrised into span(U) before it is cut. A tied embedding and head become two
    copies (stage 0's and the last stage's) of the same values: ``StageModule.tied``.
    """
    tied = not untied(model)
    if tied and ssn_rank:
        raise ValueError("SSN replaces the token embedding by its fixed-table form, which a tied head cannot "
                         "share; build the model with tie_embeddings = False")
    embedding = model.tok_embeddings.weight.detach().clone()  # (V, d)
    ssn = None
    if ssn_rank:
        ssn = ssn_tensors(model.cfg.dim, ssn_rank, embedding.shape[0], specs[0].seed, ssn_std(model))
        apply_ssn(model, *ssn)
    out = []
    for s in which:
        part = model if s == which[-1] else copy.deepcopy(model)  # the last one consumes the model
        prune_to_stage(part, s, stages)
        ctx = StageContext()
        dec = BoundaryDecoder(specs[s - 1], ctx, embedding, ssn) if s > 0 else None
        enc = BoundaryEncoder(specs[s], ctx, embedding, ssn) if s < stages - 1 else None
        out.append(StageModule(part, s, stages, ctx, dec, enc, tied))
    return out
