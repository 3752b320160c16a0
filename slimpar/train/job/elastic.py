"""Elastic runs: the batch rule when the worker count changes, and the record of every membership change.

Under ``torchrun --nnodes MIN:MAX --max-restarts K`` the elastic agents re-form the job when a node dies or
joins: the surviving (or enlarged) set of workers is restarted with a new ``WORLD_SIZE``, and each restarted
worker runs ``slimpar train`` again, which resumes from the newest complete checkpoint (docs/multinode.md,
"Elastic runs"). What keeps such a run one run:

1. **The global batch stays.** ``train.batch_size`` is the global batch (sequences or images per step, summed
   over data-parallel workers) and is part of the run's config, so every layout trains on the same B. The
   global sample positions of a step are a pure function of (step, B) (:mod:`slimpar.data.shares`); each
   worker takes its contiguous share, so a smaller world takes a larger share. :func:`fit_grad_accum` keeps
   ``train.grad_accum`` where ``world * grad_accum`` divides B and otherwise picks the largest accumulation
   below it that does (a world that does not divide B cannot keep equal shares: refused with the fix).
2. **The layout is re-planned and the checkpoint resharded.** The SDP plan is computed from the new world
   size at start-up (``sdp.memory_budget`` included: the per-worker tokens follow the new share); SDP's
   full-name checkpoints load at any worker count (:func:`slimpar.train.checkpoint.layout.check_layout`).
3. **Every change is recorded.** Rank 0 of each start appends the attempt (world size, step resumed from,
   the agent's restart count) to ``OUT/membership.json``; an attempt whose world differs from the previous
   one is a *membership change* ``{step, old_world, new_world, reason, restart}``, written to
   ``metrics.jsonl`` as a line of ``kind = "membership"`` and listed in ``summary.json`` (``membership``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from slimpar.config import Config, ConfigError
from slimpar.train.modes import mode_of
from slimpar.utils import write_text_atomic

MEMBERSHIP = "membership.json"  # in the run folder: every start's world size, and the changes between them


def restart_count() -> int:
    """How many times the elastic agent (torchrun's or slimpar's) has restarted this job's workers."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def elastic_job() -> str | None:
    """The torchrun job this worker belongs to (its rendezvous id), or None outside an elastic agent."""
    return os.environ.get("TORCHELASTIC_RUN_ID") or None


def fit_grad_accum(batch: int, accum: int, world: int) -> int:
    """The gradient accumulation a world of ``world`` data-parallel workers uses for global batch ``batch``.

    ``accum`` when ``world * accum`` divides ``batch`` (each worker takes ``batch / world``, in ``accum``
    micro-batches); else the largest ``a < accum`` with ``world * a | batch``. Raises ConfigError when
    ``world`` itself does not divide ``batch``: equal shares of the same global batch do not exist then.
    """
    if world < 1 or batch % world:
        raise ConfigError(f"the global batch train.batch_size = {batch} does not split evenly over {world} "
                          f"workers, so an elastic run cannot keep it at this size; use a batch size that every "
                          f"world size the run may take divides (e.g. a multiple of {_lcm_upto(max(world, 1))})")
    return max(a for a in range(1, max(accum, 1) + 1) if (batch // world) % a == 0)


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def join_torchrun(cfg: Config) -> Config:
    """Under torchrun, ``parallel.workers`` is the group's WORLD_SIZE (validated afterwards, by ``_train``).

    The global batch ``train.batch_size`` stays whatever the world (an elastic run re-formed with fewer or more
    workers): each data-parallel worker takes its share, with ``train.grad_accum`` lowered only where the
    share does not split into it (:func:`slimpar.train.job.elastic.fit_grad_accum`)."""
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        main = int(os.environ.get("RANK", "0")) == 0
        if cfg.parallel.workers != world and main:
            print(f"note: joining the torchrun group of {world} processes (parallel.workers = {world})")
        cfg.parallel.workers = world
        if mode_of(cfg).refits_accumulation(cfg):
            accum = fit_grad_accum(cfg.train.batch_size, cfg.train.grad_accum, world)
            if accum != cfg.train.grad_accum and main:
                print(f"note: the global batch {cfg.train.batch_size} over {world} workers: train.grad_accum "
                      f"{cfg.train.grad_accum} -> {accum}")
            cfg.train.grad_accum = accum
    return cfg


def _lcm_upto(n: int) -> int:
    from math import lcm

    return lcm(*range(1, n + 1))


def _read(out_dir: Path) -> dict[str, Any]:
    path = Path(out_dir) / MEMBERSHIP
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("attempts"), list) and isinstance(data.get("changes"), list):
            return data
    except (OSError, ValueError):
        pass
    return {"attempts": [], "changes": []}


def record_start(out_dir: Path, world: int, step: int, restart: int, job: str | None = None) -> dict[str, Any] | None:
    """Append this start to ``OUT/membership.json`` (rank 0); return the membership change it makes, if any.

    ``step`` is the step the start resumes from (0 without a checkpoint), ``restart`` the elastic agent's
    restart count (``TORCHELASTIC_RESTART_COUNT``; a re-formation for a joining node does not count),
    ``job`` the torchrun job id (``TORCHELASTIC_RUN_ID``): a start of the same job as the previous one is
    that job re-formed by its agents, any other a new start. The file is replaced atomically.
    """
    data = _read(out_dir)
    last = data["attempts"][-1] if data["attempts"] else None
    data["attempts"].append({"world": world, "step": step, "restart": restart, "job": job})
    change = None
    if last is not None and last["world"] != world:
        previous = last["world"]
        same = job is not None and last.get("job") == job
        how = f"the elastic job re-formed (agent restart count {restart})" if same else "a new start"
        verb = "left" if world < previous else "joined"
        change = {"step": step, "old_world": previous, "new_world": world,
                  "reason": f"{abs(previous - world)} worker(s) {verb}: {how}, resumed from step {step}",
                  "restart": restart}
        data["changes"].append(change)
    path = Path(out_dir) / MEMBERSHIP
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")
    return change


def record_membership(writer: Any, out_dir: Path, world: int, step: int) -> None:
    """Rank 0: this start in ``membership.json``; on another world size than the last start's, a membership change
    in ``metrics.jsonl`` (``writer``, after the line of the step resumed from) and on the console."""
    change = record_start(out_dir, world, step, restart_count(), elastic_job())
    if change is not None:
        writer.write({"kind": "membership", **change})
        print(f"membership change at step {change['step']}: {change['old_world']} -> {change['new_world']} "
              f"workers ({change['reason']})", flush=True)


def membership_changes(out_dir: Path) -> list[dict[str, Any]]:
    """Every membership change of the run in ``out_dir`` so far (``summary.json``'s ``membership``)."""
    return list(_read(out_dir)["changes"])


class SampleLog:
    """``log.samples``: the global sample positions the data-parallel workers trained on since the last log line.

    Each worker notes the share it asked the data for at the step it is training (reads for other steps, such
    as a pipeline's PCA initialisation, are not training and are left out); at a logged step every rank's
    notes are gathered (one ``all_gather_object`` on the run's group) and the distinct
    ``(dp_rank, start, stop)`` shares become ``metrics.jsonl``'s ``samples``: ``[start, stop)`` ranges sorted
    by start. Stages of one pipeline replica read the same share, which is kept once; two data-parallel
    workers that read the same positions both appear, so a duplicate shows.
    """

    def __init__(self, enabled: bool, group: Any = None) -> None:
        self.enabled, self.group = enabled, group
        self.step = -1  # the step being trained; set by the trainer
        self.shares: set[tuple[int, int, int]] = set()

    def note(self, step: int, dp_rank: int, share: range) -> None:
        if self.enabled and step == self.step:
            self.shares.add((dp_rank, share.start, share.stop))

    def collect(self) -> list[list[int]]:
        """The ranges noted on every rank since the last call (a collective when there is a group)."""
        import torch.distributed as dist

        mine, self.shares = sorted(self.shares), set()
        every = [mine]
        if self.group is not None:
            every = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(every, mine, group=self.group)
        distinct = {tuple(s) for rank in every for s in (rank or [])}
        return sorted([start, stop] for _, start, stop in distinct)
