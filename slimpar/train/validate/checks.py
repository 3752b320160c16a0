"""Start-up checks: every rule that can fail is checked here, before any process or group exists."""

from __future__ import annotations

import dataclasses
import math
import shlex
from pathlib import Path
from typing import Any

from slimpar.config import Config, ConfigError, dotted, load_config, parse_overrides
from slimpar.config import check_choice as _choice
from slimpar.data.vocab import config_vocab_size
from slimpar.parallel.compile import BACKENDS as COMPILE_BACKENDS
from slimpar.parallel.compile import SCOPES as COMPILE_SCOPES
from slimpar.train.modes import MODES as _MODES
from slimpar.train.modes import mode_of
from slimpar.train.sinks.trackers import check_trackers
from slimpar.train.validate.device import local_workers, resolve_device, visible_gpus
from slimpar.train.validate.limits import check_backend, check_memory_floor, check_writable
from slimpar.train.validate.ranges import Range

ARCHS = ("llama", "resnet18", "wrn18", "swin")
MODES = tuple(_MODES)


def load_run_config(path: str | Path | None = None, overrides: list[str] | None = None, *,
                    training: bool = True, data: bool = True) -> Config:
    """Load a run config (defaults < TOML < overrides), resolve its device for this machine and check every rule:
    what the CLI calls. ``training=False`` (``slimpar plan``) skips the rules only a training run needs (the batch
    split); a plan's device matters to nothing it prints, so ``auto`` resolves without a word. ``data=False`` (a
    memory prediction) does not ask for the corpus and tokenizer to be installed."""
    cfg = load_config(path, overrides)
    resolve_device(cfg)
    validate(cfg, training=training, data=data)
    return cfg


# who reads each mode section, for the refusal of a setting the run's mode would ignore; and the setting meant
# where a mode reads a section only in part
_READERS = {"sdp": "parallel.mode sdp, or pipeline with --pipeline.dp sdp", "pipeline": "parallel.mode pipeline"}
_INSTEAD = {"sdp.keep": "--pipeline.sdp_keep"}


def check_overrides_read(cfg: Config, overrides: list[str]) -> None:
    """Refuse a command-line setting of a mode section ([sdp], [pipeline]) that this run never reads: a
    ``--sdp.keep 0.3`` given to a DDP run would otherwise train DDP as if the flag were not there, and a hybrid
    pipeline (``pipeline.dp sdp``) reads only a few [sdp] fields (its keep is ``pipeline.sdp_keep``). A config
    file's sections stay free to hold every mode's settings; only what the command line names is checked.
    (Settings that wait on a switch, such as ``train.compile_backend`` on ``train.compile``, are left alone: a
    sweep passes them to its eager and compiled rows alike.)"""
    reads = mode_of(cfg).reads(cfg)
    for key in dotted(parse_overrides(overrides)):
        section = key.split(".", 1)[0]
        if section not in _READERS or section in reads or key in reads:
            continue
        some = [r for r in reads if r.startswith(f"{section}.")]
        if not some:
            raise ConfigError(
                f"--{key} is given, but this run's parallel.mode = {cfg.parallel.mode!r} never reads [{section}] "
                f"settings (read by: {_READERS[section]}), so the run would train as if it were not there; drop "
                "it, or choose the mode that uses it")
        instead = f" (the setting meant is likely {_INSTEAD[key]})" if key in _INSTEAD else ""
        raise ConfigError(f"--{key} is given, but of [{section}] this run reads only {', '.join(some)}, so it "
                          f"would train as if the flag were not there{instead}; drop it")


def _positive(where: str, value: float, zero_ok: bool = False) -> None:
    if value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"{where} must be {'>= 0' if zero_ok else '> 0'}, got {value}")


MAX_EVAL_BATCH = 1 << 16  # a validation batch above this would allocate for minutes before failing

# Every numeric field of the config outside [sdp] and [pipeline] (those are in validate_sdp and
# validate_pipeline); tests/unit/test_validate_numbers.py checks that no numeric field is missing.
RANGES: dict[str, Range] = {
    "model.vocab_size": Range(0, why="0 = take it from the tokenizer"),
    "model.max_seq_len": Range(0, why="0 = the size's default"),
    "model.n_kv_heads": Range(0, why="0 = the size's default"),
    "model.n_layers": Range(0, why="0 = the size's default"),
    "model.num_classes": Range(1), "model.in_channels": Range(1), "model.width": Range(1),
    "model.embed_dim": Range(1),
    "data.vocab_size": Range(0), "data.seq_len": Range(0, lo_open=True),
    "data.heldout_works": Range(0, 41, why="of Shakespeare's 42 works held out for validation; one stays to train on"),
    "train.steps": Range(0, lo_open=True), "train.batch_size": Range(0, lo_open=True),
    "train.lr": Range(0, 1e6, lo_open=True, why="the peak learning rate; far above it fp32 weights overflow"),
    "train.min_lr_ratio": Range(0, 1, why="the cosine decay ends at lr * min_lr_ratio"),
    "train.warmup_steps": Range(0), "train.weight_decay": Range(0),
    "train.beta1": Range(0, 1, hi_open=True, why="AdamW's first-moment decay"),
    "train.beta2": Range(0, 1, hi_open=True, why="AdamW's second-moment decay"),
    "train.grad_clip": Range(0, why="0 disables clipping"), "train.grad_accum": Range(1),
    "train.seed": Range(0), "train.stop_after": Range(0, why="0 = run to train.steps"),
    "train.skip_bad_steps": Range(0, why="0 = stop at the first non-finite loss"),
    "parallel.workers": Range(1, 4096, why="a plan for 16,384 workers takes minutes"),
    "parallel.timeout_s": Range(0, lo_open=True, why="seconds a collective waits"),
    "eval.every": Range(-1, why="0 = auto, -1 = only at the end"), "eval.batches": Range(0, lo_open=True),
    "eval.final_tokens": Range(0, why="0 = the same batches as every other evaluation"),
    "eval.batch_size": Range(0, MAX_EVAL_BATCH, lo_open=True, why="sequences or images per validation batch"),
    "checkpoint.every": Range(0, why="0 = only at the end"),
    "checkpoint.keep_last": Range(0, why="0 = keep every checkpoint"),
    "checkpoint.on_signal_s": Range(0, 86400, lo_open=True, why="seconds a stop signal leaves for the step and save"),
    "parallel.max_restarts": Range(0, 100, why="restarts of the whole job after a failed worker"),
    "log.every": Range(0, lo_open=True), "log.measure_step": Range(0),
}


def all_ranges() -> dict[str, Range]:
    """The rules of every numeric field, sections included (imported late: they pull in torch)."""
    from slimpar.train.validate.pipeline import PIPELINE_RANGES
    from slimpar.train.validate.sdp import SDP_RANGES

    return {**RANGES, **SDP_RANGES, **PIPELINE_RANGES}


def numeric_fields(obj: Any, prefix: str = "") -> dict[str, Any]:
    """``{"section.key": value}`` for every int, float or list-of-numbers field in the config tree."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            out.update(numeric_fields(v, f"{prefix}{f.name}."))
        elif (isinstance(v, (int, float)) and not isinstance(v, bool)) or isinstance(v, list):
            out[f"{prefix}{f.name}"] = v
    return out


def _default_of(where: str) -> Any:
    node: Any = Config()
    for part in where.split("."):
        node = getattr(node, part)
    return node


def _check_number(where: str, value: float, rule: Range | None) -> None:
    """NaN and inf slip past every ``<`` comparison, so finiteness is checked before the range."""
    default = _default_of(where)
    example = f"--{where} {default} (the default)" if not isinstance(default, list) else f"--{where} 0.5,0.5"
    if not math.isfinite(value):
        raise ConfigError(f"{where} = {value} is not a finite number; set a finite value, e.g. {example}")
    if rule is not None and not rule.contains(value):
        why = f" ({rule.why})" if rule.why else ""
        raise ConfigError(f"{where} must be {rule.describe()}, got {value}{why}; set e.g. {example}")


def check_numbers(cfg: Config) -> None:
    """Finiteness for every number in the tree and the range of every numeric field."""
    rules = all_ranges()
    for where, value in numeric_fields(cfg).items():
        for v in value if isinstance(value, list) else [value]:
            _check_number(where, v, rules.get(where))


def validate(cfg: Config, *, training: bool = True, data: bool = True, machine: bool = True) -> None:
    """Raise ConfigError with a message that names the fix for the first problem found
    (``training=False``: not the batch split over workers, which a plan does not depend on; ``data=False``: not
    whether the data is installed, which a memory prediction does not read: it needs only shapes and sizes;
    ``machine=False``: not whether this machine's memory holds the run, which ``plan --fit`` answers for another)."""
    m, d, t, p = cfg.model, cfg.data, cfg.train, cfg.parallel
    _choice("model.arch", m.arch, ARCHS)
    _choice("parallel.mode", p.mode, MODES)
    _choice("parallel.device", p.device, ("auto", "cpu", "cuda"))
    _choice("parallel.backend", p.backend, ("auto", "gloo", "nccl"))
    if "auto" in (p.device, p.backend):  # a caller's bug, not the user's: the checks below read the machine's choice
        raise ValueError("validate() needs a resolved config: call slimpar.train.validate.device.resolve_device")
    _choice("data.kind", d.kind, ("text", "images"))
    _choice("train.dtype", t.dtype, ("fp32", "bf16"))
    _choice("train.compile_backend", t.compile_backend, COMPILE_BACKENDS)
    _choice("train.compile_scope", t.compile_scope, COMPILE_SCOPES)
    _check_compile_scope(cfg)
    if p.workers < 1:
        raise ConfigError(f"parallel.workers must be >= 1, got {p.workers}")
    if p.device == "cuda":
        _check_local_gpus(cfg)
    mode = mode_of(cfg)
    mode.check(cfg)
    check_numbers(cfg)
    for where, v in [("train.steps", t.steps), ("train.batch_size", t.batch_size), ("train.lr", t.lr),
                     ("train.grad_accum", t.grad_accum), ("data.seq_len", d.seq_len),
                     ("eval.batches", cfg.eval.batches), ("eval.batch_size", cfg.eval.batch_size),
                     ("log.every", cfg.log.every)]:
        _positive(where, v)
    for where, v in [("train.warmup_steps", t.warmup_steps), ("train.weight_decay", t.weight_decay),
                     ("train.grad_clip", t.grad_clip), ("checkpoint.every", cfg.checkpoint.every),
                     ("log.measure_step", cfg.log.measure_step)]:
        _positive(where, v, zero_ok=True)
    if m.arch == "llama" and d.kind != "text":
        raise ConfigError("model.arch = 'llama' needs data.kind = 'text'")
    if m.arch != "llama" and d.kind != "images":
        raise ConfigError(f"model.arch = {m.arch!r} needs data.kind = 'images'")
    check_trackers(cfg)  # log.tensorboard, log.mlflow: their packages
    check_backend(cfg)
    if d.cache_dir:
        check_writable(d.cache_dir, "data.cache_dir")
    _validate_model(cfg)
    _validate_data(cfg, installed=data)
    if training:
        _validate_batch(cfg)
    if training and machine:
        check_memory_floor(cfg, config_vocab_size(cfg) if d.kind == "text" else None)  # the data is not read
    if mode.section is not None:
        _section_rules(cfg, mode.section)


def _section_rules(cfg: Config, section: str) -> None:
    """The rules of the section only the run's mode reads ([sdp], [pipeline]): they build its plan or specs."""
    from slimpar.train.validate.pipeline import validate_pipeline
    from slimpar.train.validate.sdp import validate_sdp

    {"sdp": validate_sdp, "pipeline": validate_pipeline}[section](cfg)


def _check_local_gpus(cfg: Config) -> None:
    """One GPU per worker process on this machine (:func:`~slimpar.train.validate.device.local_workers`); with
    ``parallel.backend`` gloo the workers may share one GPU."""
    local = local_workers(cfg)
    if cfg.parallel.backend == "gloo":  # gloo's ranks can share a GPU (parallel/placement.gpu_index)
        local = min(local, 1)
    gpus = visible_gpus()
    if gpus < local:
        raise ConfigError(f"parallel.device = 'cuda' runs {local} worker process(es) on this machine, one GPU each; "
                          f"it has {gpus} GPUs (use --parallel.device cpu, or auto)")


def _validate_model(cfg: Config) -> None:
    m = cfg.model
    if m.init_from and m.arch != "llama":
        raise ConfigError(f"model.init_from loads Hugging Face LLaMA folders; model.arch is {m.arch!r}")
    if m.arch == "llama":
        from slimpar.models.llama import LlamaConfig
        from slimpar.train.build import llama_config

        _choice("model.size", m.size, tuple(LlamaConfig.SIZES))
        # the tokenizer's size where it is known before any data is read (a BPE trained to data.vocab_size)
        known = cfg.data.vocab_size if cfg.data.tokenizer == "bpe" and cfg.data.corpus == "shakespeare" else None
        lc = llama_config(cfg, vocab_size=known if m.init_from else None)
        if cfg.data.seq_len > lc.max_seq_len:
            raise ConfigError(
                f"data.seq_len = {cfg.data.seq_len} is longer than the model's context "
                f"({lc.max_seq_len}); lower --data.seq_len or raise --model.max_seq_len")
        if lc.n_heads % lc.n_kv_heads:
            raise ConfigError(f"model.n_kv_heads = {lc.n_kv_heads} must divide the {lc.n_heads} heads")


def _validate_data(cfg: Config, installed: bool = True) -> None:
    """The data settings' own rules and (``installed``) that what they name is there."""
    d = cfg.data
    if d.kind == "text":
        _check_corpus(d.corpus)
        _choice("data.tokenizer", d.tokenizer, ("bpe", "gpt2"))
        _choice("data.ood", d.ood, ("wikipedia", "none"))
        if d.vocab_size < 300 and d.tokenizer == "bpe":
            raise ConfigError(f"data.vocab_size must be >= 300 for a byte-level BPE, got {d.vocab_size}")
        if d.corpus == "path" and not d.path:
            raise ConfigError("data.corpus = 'path' needs --data.path FILE_OR_FOLDER")
    else:
        _choice("data.image_set", d.image_set, ("fashion_mnist", "cifar10", "cifar100", "digits"))
        if d.image_set.startswith("cifar") and not d.image_dir:
            raise ConfigError(f"data.image_set = {d.image_set!r} needs --data.image_dir with CIFAR's "
                              "python-pickle batches (e.g. cifar-10-batches-py)")
    if installed:
        from slimpar.data.sources import check_available

        check_available(cfg)


def _check_corpus(corpus: str) -> None:
    """A corpus that is not a known name is most often the user's own file given in the wrong field."""
    if corpus in ("shakespeare", "path"):
        return
    looks_like_path = any(c in corpus for c in "/\\.~") or Path(corpus).expanduser().exists()
    path = shlex.quote(corpus) if looks_like_path else "FILE_OR_FOLDER"
    raise ConfigError(f"data.corpus = {corpus!r} is not one of: shakespeare, path; for your own text file, folder "
                      f"of .txt files or .npy/.bin tokens use --data.corpus path --data.path {path}")


def _validate_batch(cfg: Config) -> None:
    t = cfg.train
    dp = mode_of(cfg).data_parallel(cfg)  # SDP with FSDP2: every rank reads its own data
    if t.batch_size % (max(dp, 1) * t.grad_accum):
        raise ConfigError(
            f"train.batch_size = {t.batch_size} must be divisible by data-parallel workers ({dp}) "
            f"x train.grad_accum ({t.grad_accum})")


def _check_compile_scope(cfg: Config) -> None:
    """``train.compile_scope = model`` where the forward and loss compile as one graph without a break (the mode
    says where: ``Mode.model_scope``)."""
    t = cfg.train
    if t.compile and t.compile_scope == "model":
        refusal = mode_of(cfg).model_scope(cfg)
        if refusal:
            raise ConfigError(refusal)
