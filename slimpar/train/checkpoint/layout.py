"""``layout.json``: what a checkpoint holds (its format, model and parallel layout), and whether a run can load it.

Written beside every checkpoint by :func:`slimpar.train.checkpoint.dcp.save_checkpoint`; :func:`check_layout` compares
it with a new run's config in the launching process (exit 2) and again in every worker before DCP reads.
"""

from __future__ import annotations

import json
from pathlib import Path

from slimpar.config import ConfigError
from slimpar.train.checkpoint.manifest import ManifestError
from slimpar.train.modes import mode_of

LAYOUT = "layout.json"


def checkpoint_layout(cfg) -> dict:
    """What a checkpoint of this run holds: its ``names`` ("full": the full model's names, which single,
    DDP, FSDP2 and SDP without FSDP all write and read), the model, and the parallel layout."""
    from dataclasses import asdict

    p, d, mode = cfg.parallel, cfg.data, mode_of(cfg)
    model = {k: v for k, v in asdict(cfg.model).items() if k != "init_from"}  # the checkpoint supersedes init_from
    model["data"] = ({"kind": d.kind, "tokenizer": d.tokenizer, "vocab_size": d.vocab_size} if d.kind == "text"
                     else {"kind": d.kind, "image_set": d.image_set})
    out = {"format": 1, "names": mode.checkpoint_names(cfg), "mode": p.mode, "workers": p.workers,
           "seed": cfg.train.seed, "model": model}
    if mode.section is not None:  # the settings that name or shape the tensors (slimpar.train.modes)
        out[mode.section] = mode.layout(cfg)
    return out


SHAPE_DEFAULTS = ("n_layers", "max_seq_len", "n_kv_heads")  # 0 = the size's own value


def model_shape(model: dict) -> dict:
    """A layout's ``model`` with a LLaMA's size spelled out: ``size = "tiny"`` and ``size = "tiny", n_layers = 4``
    are one shape (every dimension resolved from ``LlamaConfig.SIZES``), and ``vocab_size = 0`` is the BPE's own
    ``data.vocab_size``. Other architectures and unknown sizes are compared as written."""
    from slimpar.models.llama import LlamaConfig

    if model.get("arch") != "llama" or model.get("size") not in LlamaConfig.SIZES:
        return model
    base = LlamaConfig.SIZES[model["size"]]
    out = {k: v for k, v in model.items() if k != "size"}
    out.update({k: out.get(k) or base[k] for k in SHAPE_DEFAULTS})
    out.update({k: base[k] for k in ("dim", "n_heads", "ffn_dim")})
    data = model.get("data") or {}
    if not out.get("vocab_size") and data.get("tokenizer") == "bpe":
        out["vocab_size"] = data.get("vocab_size")
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
    from slimpar.train.modes import MODES

    name = layout.get("mode")
    return MODES[name].layout_text(layout) if name in MODES else f"{name} ({layout.get('workers')} workers)"


def read_layout(path: Path) -> dict | None:
    """A checkpoint's ``layout.json`` (None where it has none: older slimpar); ManifestError where unreadable."""
    f = Path(path) / LAYOUT
    if not f.is_file():
        return None
    try:
        old = json.loads(f.read_bytes().decode("utf-8"))
        if not isinstance(old, dict) or not isinstance(old.get("model"), dict) or "names" not in old:
            raise ValueError("no names or model")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ManifestError(f"{f} is unreadable ({e}); use another checkpoint or start over with --fresh") from None
    return old


def keep_checkpoint_settings(cfg, path: Path | None) -> str:
    """Set in ``cfg`` what resuming the checkpoint at ``path`` keeps where the config leaves it automatic (a
    pipeline's codec rank: ``Mode.keep``); a note, or "". Applied to the new run's config and to the old one it is
    compared with (slimpar.train.launch.rerun), so a kept value is no change of settings."""
    layout = read_layout(path) if path is not None else None
    if layout is None:
        return ""
    from slimpar.train.checkpoint.pipeline import saved_rank

    return mode_of(cfg).keep(cfg, layout, {"r": saved_rank(path) if layout.get("pipeline") else None})


def check_layout(path: Path, new: dict) -> None:
    """Raise ConfigError (exit 2) unless a run with layout ``new`` can load the checkpoint at ``path``.

    The model must be the same; "full" checkpoints load into any "full" run (another SDP worker count,
    keep, level, regime or plan; single, DDP, FSDP2); "pipeline-full" ones into any pipeline with the same
    seed and codec (:func:`_check_pipeline`); other formats only into the same layout.
    Checkpoints without ``layout.json`` (older slimpar) are not checked here."""
    old = read_layout(path)
    if old is None:
        return
    fix = "resume with the checkpoint's settings, or start over with --fresh (or another --out)"
    a, b = model_shape(old["model"]), model_shape(new["model"])  # compared by value, not by how it was spelled
    if a != b:
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        shown = ", ".join(f"{k}: checkpoint {a.get(k)!r}, this run {b.get(k)!r}" for k in diff)
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
    skip = (*_RESHARDS, "rank")  # the saved r decides: an automatic rank resumes at it (Mode.keep)
    codec = _tied_diff({k: v for k, v in a.items() if k not in skip},
                       {k: v for k, v in b.items() if k not in skip}, "pipeline.")
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
