"""What the distributed and the virtual pipeline strategies share: optimizer, clipping, metrics, export.

The trainer talks to a pipeline through the same strategy interface as to DDP or SDP
(:class:`slimpar.train.strategies.base.Strategy`): ``train_step`` runs the schedule, ``clip_grad_norm`` clips by the
global norm over all stages, ``reduce_loss`` / ``step_metrics`` / ``summary_extras`` report.
Subclasses provide ``_sum_pipeline`` (sum a float64 tensor over the stages of one pipeline),
``_gather`` (every rank's object on rank 0) and the step itself.

How MAPL's projector A is stepped (docs/pipeline.md) is the pipeline library's (pipeline/training.py):
the config becomes a ``MaplTrainingSpec`` once (pipeline_specs.py), and ``build_optimizer``,
``start_step`` (SPEL's η, freezing A) and ``clip_grad_norm`` (A in the global norm, clipped on its own,
or unclipped) call into it with this strategy's hooks: the stages' module, ``_shared_syncs``,
``_owned`` and ``_sum_pipeline``.
"""

from __future__ import annotations

import abc
import contextlib
import time

import torch
from torch import nn

from slimpar.optim.spel import SPELAdamW
from slimpar.optim.timing import SpanTotal
from slimpar.pipeline import accounting, training
from slimpar.pipeline.split import StageModule
from slimpar.pipeline.ssn import effective_state_dict
from slimpar.pipeline.wire import ByteCounter
from slimpar.train.checkpoint.pipeline import PipelineCheckpoint
from slimpar.train.strategies.base import Strategy
from slimpar.train.strategies.pipeline_specs import codec_line, codec_share, training_spec


class PipelineStrategyBase(Strategy, abc.ABC):
    name = "pipeline"
    eval_sharded = False
    host_batches = True  # the trainer's batches stay on the host: the stage moves them and keeps the ids there

    def __init__(self, cfg, stages: list[StageModule], replica: int, replicas: int):
        model = stages[0] if len(stages) == 1 else nn.ModuleDict({f"stage{s.stage}": s for s in stages})
        super().__init__(model, None, cfg)
        self.stages = stages
        self.mapl_spec = training_spec(cfg)  # optimizer, SPEL schedule, freezing and clipping of A
        self.dp_rank, self.dp_world = replica, replicas
        self.counter = ByteCounter()
        self.optimizer: SPELAdamW | None = None
        self._orth = self._max_orth = None  # ‖AᵀA − I‖ as 0-d device tensors: read only when reported
        self.step_seconds = 0.0
        self.spel_time = SpanTotal()  # SPEL's time (on CUDA its device time, between events: optim.timing)
        self._t0 = time.perf_counter()
        self._stats: dict = {}
        self._summary: dict = {}
        self._checkpoint: PipelineCheckpoint | None = None
        self._pca_restarted = False
        self.codec_share = codec_share(cfg, stage_spec(stages[0]))  # r and the byte model's share of none

    # -- checkpoints ------------------------------------------------------------------------------
    @property
    def checkpoint_module(self) -> PipelineCheckpoint:
        """Saves and loads under stage-count-free names (slimpar.train.checkpoint.pipeline)."""
        if self._checkpoint is None:
            from slimpar.train.checkpoint.dcp import OPTIONS

            self._checkpoint = PipelineCheckpoint(self.model, self.stages, self.cfg.pipeline.stages,
                                                  self.cfg.pipeline.codec, OPTIONS)
        return self._checkpoint

    def _pca_keep(self, step: int) -> frozenset[int] | None:
        """The boundaries whose A a PCA start this step keeps, or None when there is no PCA start this step:
        step 0 starts every boundary, the first step after a resume with new cuts starts those only."""
        if step == 0:
            return frozenset()
        ck = self._checkpoint
        if ck is None or not ck.restarted or self._pca_restarted:
            return None
        self._pca_restarted = True
        return frozenset(p for p, b in enumerate(ck.cuts) if b not in ck.restarted)

    # -- parameters and optimizer -----------------------------------------------------------------
    def train_step(self, step: int, batch_fn, record=contextlib.nullcontext) -> float:
        """The schedule runs forward and backward of every micro-batch (``record`` wraps it all)."""
        with record():
            return self._schedule_step(step, batch_fn)

    @abc.abstractmethod
    def _schedule_step(self, step: int, batch_fn) -> float:
        """One step's schedule: the distributed stage's or the one-process pipeline's; returns the loss."""

    def build_optimizer(self, cfg) -> SPELAdamW:
        """SPEL on every Stiefel projector copy, AdamW (decay on matrices only) on everything else."""
        spec = self.mapl_spec if cfg is self.cfg else training_spec(cfg)
        self.optimizer = training.build_optimizer(self.model, self.parameters(), spec)
        return self.optimizer

    # -- how A is stepped -------------------------------------------------------------------------
    def start_step(self, step: int) -> None:
        """Before step ``step``'s forward: SPEL's η for this step, and A frozen once its steps are done."""
        training.start_step(self.mapl_spec, step, self.optimizer, self.model, self._shared_syncs())

    def freeze_projectors(self) -> None:
        """A keeps its value: no gradient (so SPEL skips it) and no gradient exchange (fewer sync bytes)."""
        training.freeze_projectors(self.model, self._shared_syncs())

    def _shared_syncs(self) -> list:
        return []

    def after_backward(self) -> None:
        """Nothing left: the schedule, replica average and shared-gradient exchange ran in train_step."""

    def _begin_step(self) -> None:
        self._t0 = time.perf_counter()
        self.counter.begin_step()

    def after_step(self) -> None:
        if self.optimizer is not None:
            self.spel_time.add(self.optimizer.last_spel_timer)
            self._orth = self.optimizer.last_orth_tensor
            if self._orth is not None:
                self._max_orth = self._orth if self._max_orth is None else torch.maximum(self._max_orth, self._orth)

    def end_of_step(self, step: int) -> None:
        super().end_of_step(step)
        # the trainer has waited for the step's kernels (on CUDA): the step's time is the device's too, as SPEL's
        # span is, and reading that span waits for nothing
        self.step_seconds += time.perf_counter() - self._t0
        self.spel_time.fold()

    @property
    def last_orth(self) -> float:
        """‖AᵀA − I‖_F of the last step (max over this rank's projectors); reading it waits for the device."""
        return float(self._orth) if self._orth is not None else 0.0

    @property
    def max_orth(self) -> float:
        return float(self._max_orth) if self._max_orth is not None else 0.0

    # -- clipping ---------------------------------------------------------------------------------
    def _owned(self) -> list[nn.Parameter]:
        """Local parameters counted in the global norm: a receiver's copy of a shared parameter is not
        (nor the last stage's copy of a tied embedding: the head's, counted once through stage 0)."""
        copies = {id(p) for s in self.stages if s.decoder is not None for _, p, _ in s.decoder.shared_parameters()}
        copies |= {id(p) for s in self.stages if s.stage > 0 for _, p, _ in s.tied_parameters()}
        return [p for p in self.parameters() if id(p) not in copies]

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip by the norm over all stages of one pipeline, the same factor on every stage; returns that norm.

        ``pipeline.clip_projector`` decides whether A's gradient counts in it (pipeline/training.py).
        """
        return training.clip_grad_norm(self.mapl_spec, self.model, self.parameters(), self._owned(), max_norm,
                                       self._sum_pipeline, self.ctx.device)

    def _sum_pipeline(self, t: torch.Tensor) -> torch.Tensor:
        return t

    # -- metrics ----------------------------------------------------------------------------------
    def rank_stats(self) -> dict:
        msgs: dict[str, int] = {}
        for s in self.stages:
            if s.encoder is not None and s.encoder.codebook is not None:
                msgs = {k: msgs.get(k, 0) + v for k, v in s.encoder.codebook.messages.items()}
        return {"rows": self.counter.as_rows(), "steps": self.counter.steps, "max_orth": self.max_orth,
                "spel_s": self.spel_time.seconds, "step_s": self.step_seconds, "resyncs": self._resyncs(),
                "codebook_messages": msgs}

    def _resyncs(self) -> int:
        return 0

    def extra_metrics(self) -> dict:
        """This rank's boundary bytes in the step just run (compare with the c10d ``send`` count)."""
        per_cat: dict[str, int] = {}
        for (b, d, c), n in self.counter.step.items():
            key = f"b{b}_{d}_{c}"
            per_cat[key] = per_cat.get(key, 0) + n
        return {"pipeline_bytes_sent": self.counter.step_bytes(), "pipeline_bytes_fwd": self.counter.step_bytes("fwd"),
                "pipeline_bytes_bwd": self.counter.step_bytes("bwd"), "pipeline_bytes_by_key": per_cat,
                "orth_error": self.last_orth}

    def step_metrics(self) -> dict:
        return dict(self._stats)

    def _tokens_per_step(self) -> int:
        return self.cfg.train.batch_size // self.dp_world * self.cfg.data.seq_len

    def _summarize(self, per_rank: list[dict]) -> None:
        d = self.stages[0].model.cfg.dim
        self._summary = accounting.summarize(per_rank, self.cfg.pipeline.stages, self.dp_world,
                                             self._tokens_per_step(), d)

    def summary_extras(self) -> dict:
        """The pipeline's numbers; after a resume also what the checkpoint's codec state became per cut."""
        resumed = self._checkpoint.report if self._checkpoint is not None else None
        return {**self._summary, "pipeline_rank": self.codec_share.rank, "pipeline_resume": resumed}

    def startup_note(self) -> str | None:
        """The codec, what its compression means, r and its bytes against none (the trainer prints it once)."""
        return codec_line(self.cfg, self.codec_share)

    def summary_rows(self, summary: dict) -> list[tuple[str, str]]:
        return accounting.summary_rows(summary)

    # -- export -----------------------------------------------------------------------------------
    def local_state_dict(self) -> dict[str, torch.Tensor]:
        """This process's stages as full-model names (SSN layers as plain weights) + ``codecs.*``."""
        out: dict[str, torch.Tensor] = {}
        for s in self.stages:
            out.update({k: v.detach().cpu().clone() for k, v in effective_state_dict(s.model).items()})
            out.update({f"codecs.{k}": v.detach().cpu().clone() for k, v in s.codecs.state_dict().items()
                        if isinstance(v, torch.Tensor)})
        return out


def stage_spec(stage: StageModule):
    """The codec spec of a stage's boundary (every boundary of a run has the same but for its index)."""
    half = stage.encoder if stage.encoder is not None else stage.decoder
    return half.spec


def tie_exported(state: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """With tied embeddings, make ``output.weight`` the very tensor of ``tok_embeddings.weight`` (as in the
    single-process model's state_dict, so the export stores one weight). The two copies are bitwise equal
    after every step; stage 0's (the exchange's sender end, which a resync copies from) is kept."""
    if tied and "tok_embeddings.weight" in state and "output.weight" in state:
        state["output.weight"] = state["tok_embeddings.weight"]
    return state
