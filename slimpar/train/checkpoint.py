"""Checkpoints with torch.distributed.checkpoint (DCP) and export of the full model to safetensors.

A checkpoint is ``OUT/checkpoints/step_{N:06d}/``: DCP shards of the model and optimizer state
(each rank writes what it holds; replicas are deduplicated by DCP's planner) plus ``trainer.json``
with the step. The optimizer state is flattened to keys named by parameter (``state.<fqn>.exp_avg``,
``param_groups.<fqn>.lr``): ranks that hold different parameters (SDP subnetworks, pipeline stages)
build different param-group lists, and index-keyed groups (``param_groups.0``) would be deduplicated
across ranks as if they were replicas, losing every rank's groups but one. Data order and
augmentation are pure functions of (seed, step), so the step is all the loader needs to resume exactly.

Single, DDP, FSDP2 and SDP without FSDP, real or virtual (:mod:`slimpar.train.sdp_checkpoint`: one copy
of each component, written by its first holder) all save this one *full-name* format, so each resumes
from the others' checkpoints, SDP with any worker count, keep or plan. ``layout.json`` (listed in the
manifest) records the format, the model and the parallel layout; :func:`check_layout` compares it with
the new run's config in the launching process (exit 2) and again in every worker before DCP reads.
Pipelines write the full model's names too, and their codec state by cut (:mod:`slimpar.train.pipeline_checkpoint`,
``"names": "pipeline-full"``), so they resume with another stage count, virtual or not, and another
``pipeline.dp`` / ``sdp_keep``; the codec settings stay tied. FSDP-sharded SDP keeps names tied to its layout.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from slimpar.config import ConfigError
from slimpar.train.manifest import ManifestError, verify_manifest, write_manifest
from slimpar.train.safe_dcp import dcp_load, read_dcp_metadata
from slimpar.utils import chmod_as_created, write_text_atomic

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)  # keys by parameter name: see above

_STEP_DIR = re.compile(r"^step_(\d{6})$")


def checkpoint_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "checkpoints"


def latest_checkpoint(out_dir: Path) -> Path | None:
    root = checkpoint_dir(out_dir)
    if not root.is_dir():
        return None
    done = [d for d in root.iterdir() if _STEP_DIR.match(d.name) and (d / "trainer.json").is_file()]
    return max(done, key=lambda d: d.name) if done else None


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
    steps = sorted((d for d in root.iterdir() if _STEP_DIR.match(d.name)), key=lambda d: d.name)
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
    must be loadable by it (:func:`check_layout`). DCP reads it through :func:`~slimpar.train.safe_dcp.dcp_load`,
    which unpickles nothing but DCP's metadata classes and plain data."""
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
    :func:`~slimpar.train.safe_dcp.read_dcp_metadata`, which runs nothing from it: a crafted file with a
    matching rewritten manifest is refused too; UnsafeCheckpointError, also exit 2).
    """
    path = Path(path)
    match = _STEP_DIR.match(path.name)
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


def check_resume(out_dir: Path, cfg=None) -> Path | None:
    """In the launching process, before any process starts: verify the checkpoint a resume would load
    (the newest complete one in ``out_dir``), and with the run's ``cfg`` that it can load it
    (:func:`check_layout`); None when there is none. Raises ManifestError / ConfigError (exit 2)."""
    path = latest_checkpoint(Path(out_dir))
    if path is not None:
        verify_checkpoint(path)
        if cfg is not None:
            check_layout(path, checkpoint_layout(cfg))
    return path


# ---------------------------------------------------------------- layout.json: what a checkpoint holds

LAYOUT = "layout.json"
# fields that name or shape a checkpoint's tensors, per mode
_TIED = {"sdp": ("level", "keep", "keep_per_worker", "memory_budget", "min_holders", "assignment", "mask_file",
                 "groups", "regime", "fsdp", "holder_shard", "virtual", "virtual_workers"),
         "pipeline": ("stages", "codec", "rank", "compression", "compression_of", "anchors", "anchor_dim",
                      "anchor_form", "virtual", "rvq.levels", "rvq.codebook", "dp", "sdp_keep")}


def _tied_fields(section, names: tuple[str, ...]) -> dict:
    """The named fields of a config section; ``a.b`` names field b of the nested section a."""
    from dataclasses import asdict

    values, out = asdict(section), {}
    for name in names:
        head, _, sub = name.partition(".")
        if sub:
            out.setdefault(head, {})[sub] = values[head][sub]
        else:
            out[name] = values[name]
    return out


def checkpoint_layout(cfg) -> dict:
    """What a checkpoint of this run holds: its ``names`` ("full": the full model's names, which single,
    DDP, FSDP2 and SDP without FSDP all write and read), the model, and the parallel layout."""
    from dataclasses import asdict

    p, s, d = cfg.parallel, cfg.sdp, cfg.data
    names = {"sdp": "sdp-fsdp" if s.fsdp > 1 or s.holder_shard else "full",
             "pipeline": "pipeline-full"}.get(p.mode, "full")
    model = {k: v for k, v in asdict(cfg.model).items() if k != "init_from"}  # the checkpoint supersedes init_from
    model["data"] = ({"kind": d.kind, "tokenizer": d.tokenizer, "vocab_size": d.vocab_size} if d.kind == "text"
                     else {"kind": d.kind, "image_set": d.image_set})
    out = {"format": 1, "names": names, "mode": p.mode, "workers": p.workers, "seed": cfg.train.seed, "model": model}
    section = {"sdp": s, "pipeline": cfg.pipeline}.get(p.mode)
    if section is not None:
        out[p.mode] = _tied_fields(section, _TIED[p.mode])
    if p.mode == "sdp" and s.memory_budget:  # the keeps follow from the budget: the launcher fills them in
        out["sdp"].pop("keep_per_worker")
    if p.mode == "pipeline":
        from slimpar.pipeline.names import cut_blocks
        from slimpar.train.build import llama_config

        out["pipeline"]["cuts"] = cut_blocks(llama_config(cfg).n_layers, cfg.pipeline.stages)
    return out


def _tied_diff(old: dict, new: dict, prefix: str) -> list[str]:
    """'key: checkpoint X, this run Y' for every tied field that differs; a field only one side names
    (written by another slimpar version, which tied more or fewer fields) is not compared."""
    out = []
    for k in sorted(set(old) & set(new)):
        if isinstance(old[k], dict) and isinstance(new[k], dict):
            out += _tied_diff(old[k], new[k], f"{prefix}{k}.")
        elif old[k] != new[k]:
            out.append(f"{prefix}{k}: checkpoint {old[k]!r}, this run {new[k]!r}")
    return out


def _describe(layout: dict) -> str:
    mode, tied = layout.get("mode"), layout.get(layout.get("mode"), {})
    if mode == "sdp":
        return (f"SDP ({layout.get('workers')} workers, keep {tied.get('keep')}, {tied.get('level')} level"
                f"{', FSDP ' + str(tied.get('fsdp')) if layout.get('names') == 'sdp-fsdp' else ''}"
                f"{', virtual' if tied.get('virtual') else ''})")
    if mode == "pipeline":
        return f"pipeline ({tied.get('stages')} stages, codec {tied.get('codec')})"
    return f"{mode} ({layout.get('workers')} workers)"


def check_layout(path: Path, new: dict) -> None:
    """Raise ConfigError (exit 2) unless a run with layout ``new`` can load the checkpoint at ``path``.

    The model must be the same; "full" checkpoints load into any "full" run (another SDP worker count,
    keep, level, regime or plan; single, DDP, FSDP2); "pipeline-full" ones into any pipeline with the same
    seed and codec (:func:`_check_pipeline`); other formats only into the same layout.
    Checkpoints without ``layout.json`` (older slimpar) are not checked here."""
    f = Path(path) / LAYOUT
    if not f.is_file():
        return
    try:
        old = json.loads(f.read_bytes().decode("utf-8"))
        if not isinstance(old, dict) or not isinstance(old.get("model"), dict) or "names" not in old:
            raise ValueError("no names or model")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ManifestError(f"{f} is unreadable ({e}); use another checkpoint or start over with --fresh") from None
    fix = "resume with the checkpoint's settings, or start over with --fresh (or another --out)"
    if old["model"] != new["model"]:
        diff = sorted(k for k in set(old["model"]) | set(new["model"]) if old["model"].get(k) != new["model"].get(k))
        shown = ", ".join(f"{k}: checkpoint {old['model'].get(k)!r}, this run {new['model'].get(k)!r}" for k in diff)
        raise ConfigError(f"{path} holds another model ({shown}); a checkpoint loads only into the same model "
                          f"shape; {fix}")
    if old["names"] == new["names"] == "full":
        return
    if old["names"] == new["names"] == "pipeline-full":
        return _check_pipeline(path, old, new, fix)
    if (old["names"], new["names"]) == ("pipeline", "pipeline-full"):  # an older slimpar's stage-local names
        new = {**new, "pipeline": {k: v for k, v in new["pipeline"].items() if k != "cuts"}}
    elif old["names"] != new["names"]:
        raise ConfigError(f"{path} was written by {_describe(old)}, whose checkpoint names ({old['names']}) a "
                          f"{_describe(new)} run cannot load; full-model checkpoints (single, DDP, FSDP2, SDP "
                          f"without sdp.fsdp/holder_shard, virtual or not) load into each other; {fix}")
    mode = new.get("mode")
    diff = _tied_diff({k: old.get(k) for k in ("workers", "seed", mode)},
                      {k: new.get(k) for k in ("workers", "seed", mode)}, "")
    if diff:
        older = (" (an older slimpar's pipeline checkpoint, under stage-local names: it resumes only with its own "
                 "layout)" if old["names"] == "pipeline" else "")
        raise ConfigError(f"{path} was written by {_describe(old)}, a layout its checkpoint is tied to{older}; this "
                          f"run ({_describe(new)}) differs in {'; '.join(diff)}; {fix}")


_RESHARDS = ("stages", "virtual", "dp", "sdp_keep", "cuts")  # a pipeline-full checkpoint loads across these


def _check_pipeline(path: Path, old: dict, new: dict, fix: str) -> None:
    """Pipeline to pipeline: any stage count, virtual or not, any ``dp``/``sdp_keep`` (names by block and cut);
    the seed must match, and the codec settings unless no cut is kept (every codec then restarts)."""
    a, b = old.get("pipeline", {}), new.get("pipeline", {})
    codec = _tied_diff({k: v for k, v in a.items() if k not in _RESHARDS},
                       {k: v for k, v in b.items() if k not in _RESHARDS}, "pipeline.")
    kept = sorted(set(a.get("cuts", [])) & set(b.get("cuts", [])))
    diff = _tied_diff({"seed": old.get("seed")}, {"seed": new.get("seed")}, "")
    if codec and (kept or "cuts" not in a):
        blocks = f"block{'s' if len(kept) > 1 else ''} {', '.join(map(str, kept))}"
        where = f"the cut{'s' if len(kept) > 1 else ''} after {blocks}" if kept else "its cuts"
        diff.append(f"{'; '.join(codec)} (another codec at {where}, which the new layout keeps)")
    if diff:
        raise ConfigError(f"{path} was written by {_describe(old)}, a layout its checkpoint is tied to in its seed "
                          f"and codec (it loads into another stage count, virtual or not, or another pipeline.dp / "
                          f"sdp_keep); this run ({_describe(new)}) differs in {'; '.join(diff)}; {fix}")


def export_safetensors(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """Write the full model; a weight tied to another (same storage) is stored once and noted."""
    from safetensors.torch import save_file

    seen: dict[tuple[int, int], str] = {}
    tensors: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen and t.shape == state[seen[key]].shape:
            tied[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.detach().contiguous().cpu()
    meta = dict(metadata, tied=json.dumps(tied))
    save_file(tensors, str(path), metadata=meta)
    chmod_as_created(path)  # save_file leaves 0600
    write_manifest(path.parent, [path.name])  # the run folder's manifest.json: verified by eval and export


def verify_export(run_dir: Path) -> None:
    """Check ``model.safetensors`` against the run folder's ``manifest.json`` before reading it."""
    files = verify_manifest(run_dir, complete=False)
    if "model.safetensors" not in files:
        raise ManifestError(f"{Path(run_dir) / 'manifest.json'} does not list model.safetensors; the export "
                            "cannot be verified (re-run the training, or if you trust the folder: "
                            f"python -m slimpar.train.manifest write {run_dir})")


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Read an export back, restoring tied names."""
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt") as f:
        for k in f.keys():
            out[k] = f.get_tensor(k)
        tied = json.loads((f.metadata() or {}).get("tied", "{}"))
    for name, src in tied.items():
        out[name] = out[src]
    return out
