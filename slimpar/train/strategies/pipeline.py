"""Compressed pipeline parallelism behind the trainer's strategy interface (docs/methods.md,
'Compressed pipelines (MAPL)').

``PipelineStrategy`` — one process per stage and replica (workers = P × R, groups.py). A step:
  0. before step 0's forward, with ``pipeline.projector_init = "pca"`` (or ``auto`` for MAPL with r < d):
     the PCA start of every A
     (pca.py: a forward-only calibration pass, stage by stage; the sender computes A and sends it);
     SPEL's η for the step and a frozen A after ``pipeline.freeze_projector_after`` (pipeline/training.py);
  1. every ``pipeline.checksum_every`` steps: checksum the shared parameters of each boundary
     (A and symmetric anchor tables) against the other end; resync from the sender on a mismatch;
  2. the schedule (GPipe or 1F1B from torch.distributed.pipelining) runs M microbatches through a
     ``CodecPipelineStage``: compressed messages forward, compressed gradients backward, every byte
     counted at the send (stage.py);
  3. replicas of a stage average their gradients (bucketed all-reduces over the stage's replica group; with
     ``pipeline.dp = "sdp"`` each block over its holders only, hybrid.py);
  4. both ends of each boundary sum their parts of the shared parameters' gradients (sync.py), and so
     do stage 0 and stage P − 1 for a tied embedding and head (exact fp32, a direct P2P link);
then the trainer clips by the global norm over the pipeline and steps SPEL + AdamW on every rank.
``VirtualPipelineStrategy`` runs the same stages and codecs in one process (virtual.py).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

from slimpar.parallel.average import average_grads
from slimpar.parallel.device import to_device
from slimpar.pipeline.evaluate import all_reduce_sum, evaluate_pipeline
from slimpar.pipeline.groups import PipelineLayout, build_groups
from slimpar.pipeline.pca import calibrate_stage, calibrate_virtual
from slimpar.pipeline.split import build_stages
from slimpar.pipeline.stage import CodecPipelineStage
from slimpar.pipeline.sync import SharedParamSync, run_phases, tied_sync
from slimpar.pipeline.virtual import VirtualPipeline
from slimpar.pipeline.wire import P2PLink
from slimpar.train.build import train_loss
from slimpar.train.evaluate import val_splits
from slimpar.train.strategies.pipeline_base import PipelineStrategyBase, tie_exported

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def build_run_stages(cfg, model, specs: list, which: list[int], device_type: str) -> list:
    """Stage modules ``which`` of the run's pipeline with the run plan's codec ``specs``
    (slimpar.train.run_plan.RunPlan.codecs), as training builds them, for ``device_type``, where their bf16
    forward autocasts (the context's device, as resolved at start-up)."""
    from slimpar.parallel.ac import apply_ac
    from slimpar.parallel.compile import apply_compile
    from slimpar.parallel.precision import DTYPES, autocast_forward
    from slimpar.pipeline.boundary import compile_codecs

    if any(s.dim != model.cfg.dim or s.vocab != model.cfg.vocab_size for s in specs):
        raise RuntimeError(f"the run plan's codec specs are for d = {specs[0].dim}, vocabulary {specs[0].vocab}; "
                           f"the model has {model.cfg.dim}, {model.cfg.vocab_size}: plan the run with the model's "
                           "vocabulary")
    ssn_rank = specs[0].rank if specs and specs[0].codec.token_table else 0  # SSN reparametrises the whole model
    stages = build_stages(model, cfg.pipeline.stages, which, specs, ssn_rank)
    for s in stages:
        if cfg.train.activation_checkpointing:
            apply_ac(s.model.layers)
        if cfg.train.compile:
            apply_compile(s.model.layers, cfg.train.compile_backend)
            compile_codecs(s.codecs, cfg.train.compile_backend)
    if cfg.train.dtype == "bf16":  # the schedule calls the stage: autocast its blocks, keep its codecs in fp32
        for s in stages:
            autocast_forward(s.model, device_type, DTYPES["bf16"])
    return stages


def _pca_batches(cfg, keep: frozenset[int] | None, batch_fn, stages: list) -> list[torch.Tensor]:
    """The first training batches (token ids) for a PCA start (``keep`` is not None: before step 0's update,
    or a resume's first step with new cuts, and the run's specs start A by PCA: ``codec_specs`` decided it with
    the run's final r); [] otherwise. A resumed run keeps the A of its kept cuts."""
    pca = any(half.spec.projector_init == "pca" for s in stages for half in s.codecs.values())
    if keep is None or not pca:
        return []
    return [batch_fn(i, 0)[0] for i in range(cfg.pipeline.pca_batches)]


def _on_device(batch_fn, device):
    """``batch_fn`` of a pipeline strategy (host tensors, ``host_batches``) moved to ``device``."""
    return lambda step, micro: tuple(to_device(t, device) for t in batch_fn(step, micro))


def _checksum_due(cfg, step: int) -> bool:
    every = cfg.pipeline.checksum_every
    return bool(every) and step > 0 and step % every == 0


class PipelineStrategy(PipelineStrategyBase):
    """One stage of one replica's pipeline on this rank."""

    def __init__(self, cfg, model, ctx, run):
        layout = PipelineLayout.of(cfg.pipeline.stages, ctx.world, ctx.rank)
        self.layout, self.ctx = layout, ctx
        self.groups = build_groups(layout, ctx.group, ctx.timeout)
        stage = build_run_stages(cfg, model, run.codecs, [layout.stage], ctx.device.type)[0].to(ctx.device)
        super().__init__(cfg, [stage], layout.replica, layout.replicas)
        mb = cfg.train.batch_size // layout.replicas // cfg.pipeline.microbatches
        self.pp_stage = CodecPipelineStage(stage, (mb, cfg.data.seq_len), model.cfg.vocab_size, ctx.device,
                                           self.groups.pipeline, layout.peers(), self.counter)
        self.schedule = SCHEDULES[cfg.pipeline.schedule](self.pp_stage, n_microbatches=cfg.pipeline.microbatches,
                                                         loss_fn=train_loss(cfg),
                                                         scale_grads=self._schedule_scales_grads())
        self.syncs, dtype = [], cfg.pipeline.sync_dtype
        if stage.decoder is not None and stage.decoder.shared_parameters():
            self.syncs.append(SharedParamSync(stage.decoder.shared_parameters(), "receiver", self.pp_stage.prev, dtype))
        if stage.encoder is not None and stage.encoder.shared_parameters():
            self.syncs.append(SharedParamSync(stage.encoder.shared_parameters(), "sender", self.pp_stage.next, dtype))
        if stage.tied_parameters():  # stage 0 (embedding) <-> stage P − 1 (head) of this replica's pipeline
            first, last = layout.stage == 0, layout.stages - 1
            link = P2PLink(last, "fwd" if first else "bwd", self.counter, layout.peers()[last if first else 0],
                           self.groups.pipeline, ctx.device)
            self.syncs.append(tied_sync(stage.tied_parameters(), "sender" if first else "receiver", link,
                                        cfg.pipeline.tied_sync_dtype))

    @property
    def stage(self):
        return self.stages[0]

    @property
    def loss_on_this_rank(self) -> bool:
        return self.pp_stage.is_last

    def _schedule_scales_grads(self) -> bool:
        """Whether the schedule divides the accumulated gradients by M itself (the hybrid's sync does)."""
        return True

    def _schedule_step(self, step: int, batch_fn) -> float:
        self._begin_step()
        keep = self._pca_keep(step)
        batches = _pca_batches(self.cfg, keep, _on_device(batch_fn, self.ctx.device), [self.stage])
        if batches:
            calibrate_stage(self.stage, batches, self.pp_stage.prev, self.pp_stage.next, self._replica_sum, keep)
        self.start_step(step)
        if _checksum_due(self.cfg, step) and self.syncs:
            run_phases(self.syncs, "check_post", "check_finish")
        host, y = batch_fn(step, 0)  # this replica's (b, T) batch: every stage reads it (ids, targets)
        x, y = to_device(host, self.ctx.device), to_device(y, self.ctx.device)
        stage, m = self.stage, self.cfg.pipeline.microbatches
        if stage.decoder is None or not stage.decoder.spec.sends_ids:
            stage.context.set_batch(x, m, host)
        losses: list[torch.Tensor] = []
        if self.pp_stage.is_first:
            self.schedule.step(x)
        elif self.pp_stage.is_last:
            self.schedule.step(target=y, losses=losses)
        else:
            self.schedule.step()
        self._replica_average()
        if self.syncs:
            run_phases(self.syncs, "post", "finish", rows=self._touched_rows())
        if not losses:  # a stage before the last has no loss of its own
            return torch.full((), math.nan, dtype=torch.float64, device=self.ctx.device)
        return torch.stack(losses).detach().mean().double()

    def _shared_syncs(self) -> list:
        return self.syncs

    def _replica_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over the R replicas of this stage (the PCA start's Gram matrix), identical bits on each."""
        if self.groups.replica is not None:
            dist.all_reduce(t, group=self.groups.replica)
        return t

    def _replica_average(self) -> None:
        """DDP-style: average each gradient over the R replicas of this stage (bucketed all-reduces)."""
        if self.groups.replica is not None:
            average_grads([p.grad for p in self.parameters() if p.grad is not None], self.groups.replica)

    def _touched_rows(self) -> torch.Tensor:
        """Anchor-table (and tied-embedding) rows with a gradient this step: the distinct ids of every
        replica's batch.

        After the replica average a row has a gradient if any replica saw its token, so the replicas
        of a stage OR their id masks (V int32 numbers in the replica group, data-parallel traffic);
        the two ends of a boundary see the same replicas' batches and so get the same rows.
        """
        rows = self.stage.context.touched_rows()
        sparse = any(is_sparse for sync in self.syncs for _, _, is_sparse in sync.params)
        if self.groups.replica is None or not sparse:
            return rows
        mask = torch.zeros(self.stage.model.cfg.vocab_size, dtype=torch.int32, device=rows.device)
        mask[rows] = 1
        dist.all_reduce(mask, group=self.groups.replica)
        return mask.nonzero().squeeze(1)

    def _sum_pipeline(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self.ctx.device)  # NCCL reduces device tensors only
        dist.all_reduce(t, group=self.groups.pipeline)
        return t  # stays on the device: the clip factors are applied there

    def _resyncs(self) -> int:
        return sum(s.resyncs for s in self.syncs)

    def reduce_loss(self, value: float, mean: float | None = None) -> float:
        """The last stages' mean loss on every rank; also gathers this step's bytes and orthogonality."""
        last = self.pp_stage.is_last
        t = torch.tensor([value if last else 0.0, 1.0 if last else 0.0, self.counter.step_bytes("fwd"),
                          self.counter.step_bytes("bwd")], dtype=torch.float64, device=self.ctx.device)
        dist.all_reduce(t, group=self.groups.world)
        orth = (self._orth.reshape(1).to(self.ctx.device).clone() if self._orth is not None  # no wait for the device
                else torch.zeros(1, dtype=torch.float64, device=self.ctx.device))
        dist.all_reduce(orth, op=dist.ReduceOp.MAX, group=self.groups.world)
        r = self.layout.replicas
        self._stats = {"pp_bytes_fwd": t[2].item() / r, "pp_bytes_bwd": t[3].item() / r,
                       "orth_error": orth.item()}
        return t[0].item() / t[1].item() if t[1].item() else math.nan

    def evaluate(self, data, cfg) -> dict:
        s = self.stage.stage
        links_in = {s - 1: self.pp_stage.prev} if self.pp_stage.prev is not None else {}
        links_out = {s: self.pp_stage.next} if self.pp_stage.next is not None else {}
        out = evaluate_pipeline([self.stage], links_in, links_out, self.counter, val_splits(data, cfg),
                                data.target_bytes, self.layout.replica, self.layout.replicas,
                                all_reduce_sum(self.groups.world, self.ctx.device))
        per_rank = [None] * self.ctx.world
        dist.all_gather_object(per_rank, self.rank_stats(), group=self.groups.world)
        self._summarize(per_rank)
        return out

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full model (and codecs) on rank 0; replica 0's stages send theirs."""
        mine = self.local_state_dict() if self.layout.replica == 0 else None
        parts = [None] * self.ctx.world if self.ctx.rank == 0 else None
        dist.gather_object(mine, parts, dst=0, group=self.groups.world)
        out: dict[str, torch.Tensor] = {}
        for part in parts or []:
            out.update(part or {})
        return tie_exported(out, self.stage.tied)


class VirtualPipelineStrategy(PipelineStrategyBase):
    """All P stages in this process (``pipeline.virtual = true``)."""

    def __init__(self, cfg, model, ctx, run):
        self.ctx = ctx
        every = list(range(cfg.pipeline.stages))
        stages = [s.to(ctx.device) for s in build_run_stages(cfg, model, run.codecs, every, ctx.device.type)]
        super().__init__(cfg, stages, 0, 1)
        pc = cfg.pipeline
        self.pipe = VirtualPipeline(stages, self.counter, train_loss(cfg), pc.sync_dtype, pc.tied_sync_dtype,
                                    pc.virtual_microbatched)
        if self.pipe.fallback:
            print(f"note: the virtual pipeline runs microbatch by microbatch: {self.pipe.fallback}", flush=True)
        self.resyncs = 0

    def _schedule_step(self, step: int, batch_fn) -> float:
        self._begin_step()
        keep = self._pca_keep(step)
        batches = _pca_batches(self.cfg, keep, _on_device(batch_fn, self.ctx.device), self.stages)
        if batches:
            calibrate_virtual(self.stages, self.pipe.links, batches, keep)
        self.start_step(step)
        if _checksum_due(self.cfg, step):
            self.resyncs += self.pipe.check_shared()
        host, y = batch_fn(step, 0)
        x, y = to_device(host, self.ctx.device), to_device(y, self.ctx.device)
        return self.pipe.step(x, y, self.cfg.pipeline.microbatches, host)

    def _resyncs(self) -> int:
        return self.resyncs

    def _shared_syncs(self) -> list:
        return [end for pair in self.pipe.syncs for end in pair]

    def reduce_loss(self, value: float, mean: float | None = None) -> float:
        self._stats = {"pp_bytes_fwd": self.counter.step_bytes("fwd"), "pp_bytes_bwd": self.counter.step_bytes("bwd"),
                       "orth_error": self.last_orth}
        return value

    def evaluate(self, data, cfg) -> dict:
        links_in = {p: pair[1] for p, pair in enumerate(self.pipe.links)}
        links_out = {p: pair[0] for p, pair in enumerate(self.pipe.links)}
        out = evaluate_pipeline(self.stages, links_in, links_out, self.counter, val_splits(data, cfg),
                                data.target_bytes)
        self._summarize([self.rank_stats()])
        return out

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return tie_exported(self.local_state_dict(), self.stages[0].tied)


def build_virtual_pipeline_strategy(cfg, model, ctx, run) -> VirtualPipelineStrategy:
    """``pipeline.virtual = true``: every stage in this process."""
    return VirtualPipelineStrategy(cfg, model, ctx, run)


def build_pipeline_strategy(cfg, model, ctx, run):
    """The strategy ``parallel.mode = "pipeline"`` asks for (slimpar.train.strategies.build_strategy)."""
    if ctx.group is None:
        raise RuntimeError("a distributed pipeline needs a process group; use --pipeline.virtual true for one process")
    return PipelineStrategy(cfg, model, ctx, run)  # SDP among the replicas (pipeline.dp = "sdp"): hybrid.py
