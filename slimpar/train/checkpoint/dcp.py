"""Checkpoints with torch.distributed.checkpoint (DCP): save, prune, verify and load.

A checkpoint is ``OUT/checkpoints/step_{N:06d}/``: DCP shards of the model and optimizer state
(each rank writes what it holds; replicas are deduplicated by DCP's planner) plus ``trainer.json``
with the step. The optimizer state is flattened to keys named by parameter (``state.<fqn>.exp_avg``,
``param_groups.<fqn>.lr``): ranks that hold different parameters (SDP subnetworks, pipeline stages)
build different param-group lists, and index-keyed groups (``param_groups.0``) would be deduplicated
across ranks as if they were replicas, losing every rank's groups but one. Data order and
augmentation are pure functions of (seed, step), so the step is all the loader needs to resume exactly.

Single, DDP, FSDP2 and SDP without FSDP, real or virtual (:mod:`slimpar.train.checkpoint.sdp`: one copy
of each component, written by its first holder) all save this one *full-name* format, so each resumes
from the others' checkpoints, SDP with any worker count, keep or plan. ``layout.json`` (listed in the
manifest) records the format, the model and the parallel layout; :func:`check_layout` compares it with
the new run's config in the launching process (exit 2) and again in every worker before DCP reads.
Pipelines write the full model's names too, and their codec state by cut (:mod:`slimpar.train.checkpoint.pipeline`,
``"names": "pipeline-full"``), so they resume with another stage count, virtual or not, and another
``pipeline.dp`` / ``sdp_keep``; the codec settings stay tied. FSDP-sharded SDP keeps names tied to its layout.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from slimpar.train.checkpoint.folders import STEP_DIR, checkpoint_dir
from slimpar.train.checkpoint.layout import LAYOUT, check_layout
from slimpar.train.checkpoint.manifest import ManifestError, verify_manifest, write_manifest
from slimpar.train.checkpoint.safe_dcp import dcp_load, read_dcp_metadata
from slimpar.utils import write_text_atomic

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)  # keys by parameter name: see above



def save_checkpoint(out_dir: Path, step: int, model, optimizer, rank: int, group=None, keep_last: int = 0,
                    layout: dict | None = None) -> Path:
    """Save model + optimizer after ``step`` steps. ``trainer.json`` is written last, by rank 0,
    so a directory without it is an interrupted save and is never resumed from. Then rank 0 keeps
    only the newest ``keep_last`` complete checkpoints (0 = all): see :func:`prune_checkpoints`.
    ``model`` may be an object with ``state_to_save(optimizer)`` (SDP: this rank's share of the full-name
    state dicts); ``layout`` (:func:`checkpoint_layout`) is written to ``layout.json`` by rank 0."""
    path = checkpoint_dir(out_dir) / f"step_{step:06d}"
    if hasattr(model, "state_to_save"):
        model_sd, optim_sd = model.state_to_save(optimizer)
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIONS)
    try:
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path), process_group=group)
    except BaseException:  # DCP's CheckpointException is a BaseException; every rank gets it, rank 0 removes
        # the partial folder (a full disk) so that nothing half-written stays behind
        if rank == 0 and not (path / "trainer.json").exists():
            shutil.rmtree(path, ignore_errors=True)
        raise
    if dist.is_initialized():
        dist.barrier(group=group)
    if rank == 0:
        if layout is not None:
            (path / LAYOUT).write_text(json.dumps(layout, indent=1, sort_keys=True) + "\n")
        trainer = json.dumps({"step": step})
        write_manifest(path, extra={"trainer.json": trainer.encode()})  # sha256 of every file, trainer.json too
        write_text_atomic(path / "trainer.json", trainer)  # last: it marks the checkpoint complete
        if keep_last:
            prune_checkpoints(out_dir, keep_last)
    return path


def prune_checkpoints(out_dir: Path, keep_last: int) -> list[Path]:
    """Delete the step folders older than the ``keep_last`` newest complete checkpoints; returns them.

    Called by rank 0 only, after the barrier of a successful save, so the newest complete checkpoint
    (the one just written) is never among them; every interrupted save (no ``trainer.json``) goes too, with
    ``keep_last = 0`` as well.
    ``trainer.json`` is removed first, so a prune killed halfway leaves an incomplete folder that is
    never resumed from, not a complete-looking one with shards missing.
    """
    root = checkpoint_dir(out_dir)
    steps = sorted((d for d in root.iterdir() if STEP_DIR.match(d.name)), key=lambda d: d.name)
    complete = [d for d in steps if (d / "trainer.json").is_file()]
    doomed = [d for d in steps if d not in complete]  # interrupted saves (a crash, a full disk): never resumed
    if keep_last >= 1 and len(complete) > keep_last:
        oldest_kept = complete[-keep_last].name
        doomed += [d for d in complete if d.name < oldest_kept]
    for d in doomed:
        (d / "trainer.json").unlink(missing_ok=True)
        shutil.rmtree(d, ignore_errors=True)
    return doomed


def load_checkpoint(path: Path, model, optimizer, group=None, layout: dict | None = None) -> int:
    """Load into ``model``/``optimizer`` in place; returns the number of steps already done.
    The folder is verified first (:func:`verify_checkpoint`); with this run's ``layout``, the checkpoint's
    must be loadable by it (:func:`check_layout`). DCP reads it through
    :func:`~slimpar.train.checkpoint.safe_dcp.dcp_load`, which unpickles nothing but DCP's metadata classes and
    plain data."""
    step = verify_checkpoint(path)
    if layout is not None:
        check_layout(path, layout)
    if hasattr(model, "load_from"):  # SDP: each worker takes its subnetwork from the full-name state
        model.load_from(path, optimizer, group)
        return step
    model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIONS)
    state = {"model": model_sd, "optim": optim_sd}
    dcp_load(state, path, group)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=OPTIONS)
    return step


# ---------------------------------------------------------------- verification before loading (trust: docs/trust.md)


def verify_checkpoint(path: Path) -> int:
    """Check a checkpoint folder before anything reads it; returns its step, or raises ManifestError.

    Every file must match ``manifest.json`` (sha256 and size; nothing unlisted), ``trainer.json``'s step
    must equal the folder's, and DCP's ``.metadata`` must hold only DCP's metadata classes (read by
    :func:`~slimpar.train.checkpoint.safe_dcp.read_dcp_metadata`, which runs nothing from it: a crafted file with a
    matching rewritten manifest is refused too; UnsafeCheckpointError, also exit 2).
    """
    path = Path(path)
    match = STEP_DIR.match(path.name)
    if match is None:
        raise ManifestError(f"{path} is not a checkpoint folder (step_NNNNNN)")
    verify_manifest(path, complete=True)
    fix = "the checkpoint was edited; use another checkpoint or start over with a new --out"
    try:
        step = json.loads((path / "trainer.json").read_bytes().decode("utf-8"))["step"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ManifestError(f"{path / 'trainer.json'} is unreadable ({e}); {fix}") from None
    if not isinstance(step, int) or isinstance(step, bool) or step != int(match.group(1)):
        raise ManifestError(f"{path / 'trainer.json'} says step {step!r} but the folder is {path.name}; {fix}")
    read_dcp_metadata(path / ".metadata")
    return step
