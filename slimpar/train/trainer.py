"""The training loop: build → parallelize → (resume) → steps → evaluate → checkpoint → summary.

One code path from 1 to N ranks: with a single process every collective is skipped. Step ``log.measure_step``
runs under :class:`~slimpar.parallel.comm.StepInstrument` for exact memory and byte accounting; the
other steps are timed without instrumentation.
"""

from __future__ import annotations

import json
import time

import torch
import torch.distributed as dist

from slimpar.config import Config, to_dict
from slimpar.parallel.compile import CompileWatch, merge_watches
from slimpar.train.build import build_data, build_model, eval_every, final_eval_config, lr_at, total_steps
from slimpar.train.checkpoint.dcp import load_checkpoint, save_checkpoint
from slimpar.train.checkpoint.export import export_safetensors
from slimpar.train.checkpoint.folders import checkpoint_dir, latest_checkpoint
from slimpar.train.checkpoint.init_from import check_init_from
from slimpar.train.checkpoint.layout import checkpoint_layout
from slimpar.train.guard import StepGuard, check_export
from slimpar.train.job.context import RunContext
from slimpar.train.job.elastic import SampleLog, membership_changes, record_membership
from slimpar.train.job.preempt import STOP_SIGNALS, StopRequest
from slimpar.train.job.run_files import record_run_files
from slimpar.train.run_plan import run_plan
from slimpar.train.sinks.metrics import (
    MetricsWriter,
    git_commit,
    median_step_time,
    merge_ranks,
    print_summary,
    val_gap_warning,
    versions,
)
from slimpar.train.sinks.progress import TrainProgress
from slimpar.train.sinks.trackers import build_sinks
from slimpar.train.speed import speed_fields
from slimpar.train.step import TrainStep
from slimpar.train.strategies import build_strategy


class Trainer:
    def __init__(self, cfg: Config, ctx: RunContext, stop: StopRequest | None = None):
        self.cfg, self.ctx = cfg, ctx
        self.stop = stop or StopRequest.inactive()  # SIGTERM / SIGUSR1 in a worker (slimpar.train.job.preempt)
        self.writer = MetricsWriter(ctx.out_dir, enabled=ctx.is_main)
        self.sinks = build_sinks(cfg, ctx.out_dir) if ctx.is_main else []  # trackers: log.tensorboard, log.mlflow
        self.step_times: list[float] = []
        self.losses: list[float] = []
        self.measured: dict | None = None

    # ----------------------------------------------------------------- setup
    def _build(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        if ctx.group is not None and not ctx.is_main:
            dist.barrier(group=ctx.group)  # rank 0 builds tokenizer and token caches first
        self.data = build_data(cfg)
        if ctx.is_main:
            record_run_files(cfg, self.data, ctx.out_dir)  # the tokenizer and the real vocabulary size
        if ctx.group is not None and ctx.is_main:
            dist.barrier(group=ctx.group)
        check_init_from(cfg, ctx.out_dir)  # again in every worker, before it reads the weights
        model = build_model(cfg, self.data)
        self.strategy = build_strategy(run_plan(cfg, getattr(self.data, "vocab_size", None)), model, ctx)
        note = self.strategy.startup_note()
        if note and ctx.is_main:
            print(note, flush=True)
        self.optimizer = self.strategy.build_optimizer(cfg)  # AdamW; pipelines add SPEL for Stiefel projectors
        self.total = total_steps(cfg)
        self.eval_every = eval_every(cfg, self.total)
        self.guard = StepGuard(cfg.train.skip_bad_steps, ctx.group, cfg.train.lr, ctx.rank, STOP_SIGNALS)
        self.samples = SampleLog(cfg.log.samples, ctx.group)
        # the groups' base rates are read here, before a resume overwrites them
        self.steps = TrainStep(cfg, ctx, self.data, self.strategy, self.optimizer, self.guard, self.stop,
                               self.samples)
        self.start, self.resumed_from = 0, None
        if cfg.checkpoint.resume:  # auto: the newest complete checkpoint, if any (--fresh: none)
            path = latest_checkpoint(ctx.out_dir)
            if path is not None:
                self.start = load_checkpoint(path, self.strategy.checkpoint_module, self.optimizer, ctx.group,
                                             checkpoint_layout(cfg))
                self.resumed_from = str(path)
                if ctx.is_main:
                    print(f"resuming from step {self.start}, checkpoint {path}", flush=True)
        self.writer.truncate(self.start)  # the steps after the checkpoint are redone: each step is logged once

    # ------------------------------------------------------------------- run
    def run(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        self._build()
        progress = TrainProgress(ctx.is_main and cfg.log.progress, self.start, self.total, self.items_per_step,
                             "tok/s" if cfg.data.kind == "text" else "img/s")
        measure_at = max(min(cfg.log.measure_step, self.total - 1), self.start)
        end = min(cfg.train.stop_after, self.total) if cfg.train.stop_after else self.total
        if self.start >= end and (end < self.total or (ctx.out_dir / "summary.json").exists()):
            if ctx.is_main:
                print(f"note: {ctx.out_dir} already holds the checkpoint of step {self.start}: nothing to train "
                      "(slimpar train --fresh starts over)", flush=True)
            return
        if ctx.is_main:
            record_membership(self.writer, ctx.out_dir, ctx.world, self.start)
        self.stop.arm()  # a stop signal now ends the run at the next step boundary, with a checkpoint there
        watch = CompileWatch()
        watch.start()
        for step in range(self.start, end):
            t0 = time.perf_counter()
            if step == measure_at:  # exact memory and bytes (train/step.py, train/memory/measured.py)
                (loss, gnorm), self.measured = self.steps.measured(step)
            else:
                loss, gnorm = self.steps.run(step)
            if ctx.device.type == "cuda":  # the step's kernels have run, not only been queued
                torch.cuda.synchronize(ctx.device)
            # every step's own time goes to metrics.jsonl; the instrumented one (slower) stays out of the median
            self.last_step_time = (time.perf_counter() - t0, step == measure_at)
            if step != measure_at:
                self.step_times.append(self.last_step_time[0])
            self.strategy.end_of_step(step)
            if step == self.start + 1:  # compiled graphs after this one are recompiles (summary.json: compile)
                watch.warm()
            self._after_step(step, loss, gnorm, progress)
            if self.guard.signal:  # agreed in the step's guard: every rank stops after this step or none does
                self._stop(self.guard.signal, step + 1, progress)
        progress.close()
        if cfg.train.compile and self.measured is not None:  # before evaluation, which compiles without grad
            self.measured["compile"] = watch.record()
        if end < self.total:  # a planned stop: save and leave the rest to --resume
            path = save_checkpoint(ctx.out_dir, end, self.strategy.checkpoint_module, self.optimizer, ctx.rank,
                                   ctx.group, cfg.checkpoint.keep_last, checkpoint_layout(cfg))
        else:
            self._finish()
            path = latest_checkpoint(ctx.out_dir)
        signum = self.stop.agreed(ctx.group, ctx.device)  # a stop signal during the last save or evaluation
        if signum:
            raise self.stop.stopped(signum, end, path, finished=end == self.total)

    def _stop(self, signum: int, done: int, progress) -> None:
        """Every rank agreed to stop after step ``done``: its checkpoint (unless the periodic save just wrote it),
        the trackers flushed, then :class:`~slimpar.train.job.preempt.Stopped` (exit 143)."""
        progress.close()
        cfg, ctx = self.cfg, self.ctx
        path = checkpoint_dir(ctx.out_dir) / f"step_{done:06d}"
        if not (cfg.checkpoint.every and done % cfg.checkpoint.every == 0 and done != self.total):
            path = save_checkpoint(ctx.out_dir, done, self.strategy.checkpoint_module, self.optimizer, ctx.rank,
                                   ctx.group, cfg.checkpoint.keep_last, checkpoint_layout(cfg))
        for sink in self.sinks:
            sink.close()
        raise self.stop.stopped(signum, done, path)

    def _after_step(self, step: int, loss: float, gnorm: float, progress) -> None:
        cfg, done = self.cfg, step + 1
        last = done == self.total
        if done % cfg.log.every == 0 or last:
            mean_loss = self.strategy.reduce_loss(loss, self.guard.mean_loss)
            self.losses.append(mean_loss)
            seconds, instrumented = self.last_step_time
            record = {"step": done, "loss": mean_loss, "lr": lr_at(step, cfg, self.total), "grad_norm": gnorm,
                      "step_time_s": seconds, **({"instrumented": True} if instrumented else {})}
            if self.eval_every and done % self.eval_every == 0 and not last:
                record.update(self._evaluate())
            record.update(self.strategy.step_metrics())
            if cfg.log.samples:
                record["samples"] = self.samples.collect()
            self.writer.write(record)
            for sink in self.sinks:
                sink.write(record)
            progress.update(done, mean_loss)
        else:
            progress.update(done, None)
        if cfg.checkpoint.every and done % cfg.checkpoint.every == 0 and not last:
            ctx = self.ctx
            save_checkpoint(ctx.out_dir, done, self.strategy.checkpoint_module, self.optimizer, ctx.rank, ctx.group,
                            cfg.checkpoint.keep_last, checkpoint_layout(cfg))

    @property
    def items_per_step(self) -> int:
        """Tokens (images for image models) a step trains on, summed over data-parallel workers."""
        return self.cfg.train.batch_size * (self.cfg.data.seq_len if self.cfg.data.kind == "text" else 1)

    def _evaluate(self, final: bool = False) -> dict:
        return self.strategy.evaluate(self.data, final_eval_config(self.cfg) if final else self.cfg)

    def _finish(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        results = self._evaluate(final=True)
        if cfg.checkpoint.final and self.start < self.total:
            save_checkpoint(ctx.out_dir, self.total, self.strategy.checkpoint_module, self.optimizer, ctx.rank,
                            ctx.group, cfg.checkpoint.keep_last, checkpoint_layout(cfg))
        full = self.strategy.full_state_dict() if cfg.checkpoint.export else None
        per_rank = [self.measured] * 1
        if ctx.group is not None:
            per_rank = [None] * ctx.world
            dist.all_gather_object(per_rank, self.measured, group=ctx.group)
        if ctx.is_main:
            self._write_outputs(results, per_rank, full)

    def _write_outputs(self, results: dict, per_rank: list, full) -> None:
        cfg, ctx = self.cfg, self.ctx
        st = median_step_time(self.step_times)
        tokens_per_s = self.items_per_step / st if st else None
        summary = {
            "mode": cfg.parallel.mode,
            "train_loss": self.losses[-1] if self.losses else float("nan"),
            **results,
            **(merge_ranks(per_rank) if per_rank and per_rank[0] is not None else {}),
            "step_time_s": st,
            "tokens_per_s": tokens_per_s,
            **speed_fields(cfg, getattr(self.data, "vocab_size", None), tokens_per_s, ctx.device, ctx.world),
            **self.strategy.summary_extras(),
            **({"compile": merge_watches([r.get("compile") for r in per_rank if r])} if cfg.train.compile else {}),
            "world_size": ctx.world,
            "steps": self.total,
            "skipped_steps": self.guard.skipped,
            "resumed_from_step": self.start if self.resumed_from else None,  # this invocation's start
            "resumed_from": self.resumed_from,
            "membership": membership_changes(ctx.out_dir),  # every change of the world size (elastic.py)
            "config": to_dict(cfg),
            "git_commit": git_commit(),
            "versions": versions(),
        }
        if cfg.data.kind == "text":
            summary["val_bits_per_byte"] = results.get("val_bits_per_byte")
        if full is not None:
            check_export(full)
            export_safetensors(full, ctx.out_dir / "model.safetensors",
                               {"config": json.dumps(to_dict(cfg)), "step": str(self.total)})
        warning = val_gap_warning(summary["train_loss"], results.get("val_loss"), self.strategy.val_gap_fix())
        if warning:
            summary["warnings"] = [warning]
            print(f"warning: {warning}", flush=True)
        (ctx.out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        for sink in self.sinks:
            sink.write_summary(summary, self.total)
            sink.close()
        print_summary(summary, self.strategy.summary_rows(summary))
