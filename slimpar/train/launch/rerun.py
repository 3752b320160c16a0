"""A re-run in a run folder that holds a checkpoint: what changed since the run began.

``slimpar train`` without ``--out`` runs in ``runs/<config name>`` (:func:`slimpar.train.launch.launcher.run_name`), so
the same command twice resumes the same run. The folder's ``config.toml`` (the resolved config the run was
started with) is compared with the new one before any process starts:

- fields that define the run (model, data, seed, optimizer, schedule, pipeline settings) must match, or the
  re-run stops with exit 2 and names them; ``--allow-change`` accepts them (the old config is kept as
  ``config.before_step_NNNNNN.toml``). ``train.steps`` is one of them: extending a finished run re-stretches the
  cosine schedule, so the message gives the lr after the checkpoint's step before and after the change;
- the parallel layout (``parallel.mode``, ``parallel.workers``, ``sdp.*``, ``train.grad_accum``,
  ``pipeline.stages``, ``.virtual``, ``.dp``, ``.sdp_keep``) is noted, not refused: full-name checkpoints reshard
  (single, DDP, FSDP2, SDP at any worker count or keep; pipelines at any stage count,
  slimpar.train.checkpoint.pipeline), and a layout the
  checkpoint cannot serve is refused by :func:`slimpar.train.checkpoint.layout.check_layout` before this runs;
- fields that change only logging, evaluation, checkpointing, time-outs or speed are accepted silently.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from slimpar.config import Config, ConfigError, dotted, load_config, to_dict
from slimpar.train.checkpoint.layout import SHAPE_DEFAULTS, keep_checkpoint_settings, model_shape
from slimpar.train.modes import mode_of

# accepted silently: they change what is logged, evaluated or saved, or how fast, not what is trained
ACCEPTED = ("log.", "eval.", "checkpoint.", "parallel.timeout_s", "parallel.max_restarts", "parallel.backend",
            "parallel.device", "train.stop_after", "train.skip_bad_steps", "train.activation_checkpointing",
            "data.cache_dir", "data.ood", "model.init_from", "sdp.check_every", "pipeline.checksum_every")
# noted; check_layout refuses what a checkpoint cannot load. train.grad_accum follows the worker count under an
# elastic torchrun (slimpar.train.job.elastic.fit_grad_accum): the same global batch, summed in other micro-batches
LAYOUT = ("parallel.mode", "parallel.workers", "sdp.", "train.grad_accum", "pipeline.stages", "pipeline.virtual",
          "pipeline.dp", "pipeline.sdp_keep")


def config_changes(old: Config, new: Config) -> tuple[list[str], list[str]]:
    """``(defining, layout)``: the changed fields as ``"train.lr: 0.003 -> 0.001"``. A section that neither run
    uses (``sdp.*`` outside SDP, ``pipeline.*`` outside pipelines) is not compared, nor ``model.vocab_size``
    when the new run leaves it to the tokenizer (0; ``config.toml`` names the real size)."""
    a, b = dotted(to_dict(old)), dotted(to_dict(new))
    if _same_shape(old, new):  # --model.n_layers 4 on tiny spells out tiny's own value: not a change
        for key in ("model.size", *(f"model.{k}" for k in SHAPE_DEFAULTS)):
            a.pop(key, None), b.pop(key, None)
    sections = {mode_of(old).section, mode_of(new).section}
    defining, layout = [], []
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key) or key.startswith(ACCEPTED):
            continue
        section = key.split(".")[0]
        if section in ("sdp", "pipeline") and section not in sections:
            continue
        if key == "model.vocab_size" and not b.get(key):
            continue
        change = f"{key}: {a.get(key)!r} -> {b.get(key)!r}"
        (layout if key.startswith(LAYOUT) else defining).append(change)
    return defining, layout


def _same_shape(old: Config, new: Config) -> bool:
    def shape(cfg: Config) -> dict:
        model = {k: v for k, v in to_dict(cfg)["model"].items() if k != "vocab_size"}
        return model_shape({**model, "data": {}})

    return shape(old) == shape(new)


def _schedule_note(old: Config, new: Config, step: int) -> str:
    """What a changed step count does to the learning rate after ``step`` (the cosine is stretched)."""
    from slimpar.train.build import lr_at, total_steps

    before, after = lr_at(step, old, total_steps(old)), lr_at(step, new, total_steps(new))
    spans = f" (the cosine learning-rate schedule now spans {total_steps(new)} steps, not {total_steps(old)}"
    if f"{after:.2e}" == f"{before:.2e}":  # e.g. still in warm-up: the stretch shows only later
        return spans + ")"
    return f"{spans}: the lr after step {step} becomes {after:.2e} instead of {before:.2e})"


def check_rerun(out_dir: Path, cfg: Config, checkpoint: Path, step: int, allow: bool, main: bool = True) -> None:
    """Compare ``cfg`` with the ``config.toml`` of the run whose checkpoint at ``step`` it resumes.

    Raises ConfigError (exit 2) naming the changed run-defining fields unless ``allow``; with ``allow`` the
    changes are printed as a warning and the old config is kept beside the new one. Layout changes are noted."""
    path = Path(out_dir) / "config.toml"
    if not path.is_file():
        return
    try:
        old = load_config(path)
    except ConfigError as e:  # written by another slimpar version: nothing to compare field by field
        if main:
            print(f"note: {path} is not comparable with this run's config ({e}); resuming without the check")
        return
    keep_checkpoint_settings(old, checkpoint)  # what the new run keeps from the checkpoint, the old one kept too
    defining, layout = config_changes(old, cfg)
    notes = [c + (_schedule_note(old, cfg, step) if c.startswith("train.steps:") else "") for c in defining]
    if defining and not allow:
        raise ConfigError(f"{out_dir} holds a run (checkpoint {checkpoint}) whose settings differ from this one's: "
                          f"{'; '.join(notes)}. Resume with the run's settings, pass --allow-change to continue "
                          f"it with the new ones, or start over with --fresh (or another --out)")
    if not main:
        return
    if defining:
        keep = Path(out_dir) / f"config.before_step_{step:06d}.toml"
        shutil.copyfile(path, keep)
        print(f"warning: --allow-change: resuming {out_dir} from step {step} with changed settings: "
              f"{'; '.join(notes)} (the run's config so far is kept as {keep.name})", flush=True)
    if layout:
        print(f"note: resuming {out_dir} from step {step} on another parallel layout (the checkpoint "
              f"reshards): {'; '.join(layout)}", flush=True)
