"""Start-up checks: every rule that can fail is checked here, before any process or group exists."""

from __future__ import annotations

from pathlib import Path

from slimpar.config import Config, ConfigError, load_config
from slimpar.config import check_choice as _choice

ARCHS = ("llama", "resnet18", "wrn18", "swin")
MODES = ("single", "ddp", "fsdp", "sdp", "pipeline")


def load_run_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a run config (defaults < TOML < overrides) and check every rule: what the CLI calls."""
    cfg = load_config(path, overrides)
    validate(cfg)
    return cfg


def _positive(where: str, value: float, zero_ok: bool = False) -> None:
    if value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"{where} must be {'>= 0' if zero_ok else '> 0'}, got {value}")


def validate(cfg: Config) -> None:
    """Raise ConfigError with a message that names the fix for the first problem found."""
    m, d, t, p = cfg.model, cfg.data, cfg.train, cfg.parallel
    _choice("model.arch", m.arch, ARCHS)
    _choice("parallel.mode", p.mode, MODES)
    _choice("parallel.device", p.device, ("cpu", "cuda"))
    _choice("parallel.backend", p.backend, ("auto", "gloo", "nccl"))
    _choice("data.kind", d.kind, ("text", "images"))
    _choice("train.dtype", t.dtype, ("fp32", "bf16"))
    if p.workers < 1:
        raise ConfigError(f"parallel.workers must be >= 1, got {p.workers}")
    if p.device == "cuda":
        import torch

        if torch.cuda.device_count() < (1 if p.mode == "single" or cfg.pipeline.virtual else p.workers):
            raise ConfigError(f"parallel.device = 'cuda' with {p.workers} worker(s) needs as many GPUs; "
                              f"this machine has {torch.cuda.device_count()} (use --parallel.device cpu)")
    if p.mode == "single" and p.workers != 1:
        raise ConfigError("parallel.mode = 'single' runs one worker; set --parallel.mode ddp|fsdp|sdp for more")
    for where, v in [("train.steps", t.steps), ("train.batch_size", t.batch_size), ("train.lr", t.lr),
                     ("train.grad_accum", t.grad_accum), ("data.seq_len", d.seq_len),
                     ("eval.batches", cfg.eval.batches), ("eval.batch_size", cfg.eval.batch_size),
                     ("log.every", cfg.log.every)]:
        _positive(where, v)
    for where, v in [("train.warmup_steps", t.warmup_steps), ("train.weight_decay", t.weight_decay),
                     ("train.grad_clip", t.grad_clip), ("checkpoint.every", cfg.checkpoint.every),
                     ("eval.every", cfg.eval.every), ("log.measure_step", cfg.log.measure_step)]:
        _positive(where, v, zero_ok=True)
    if t.dtype == "bf16" and p.device != "cuda":
        raise ConfigError("train.dtype = 'bf16' autocast is for GPUs; use --parallel.device cuda or fp32")
    if m.arch == "llama" and d.kind != "text":
        raise ConfigError("model.arch = 'llama' needs data.kind = 'text'")
    if m.arch != "llama" and d.kind != "images":
        raise ConfigError(f"model.arch = {m.arch!r} needs data.kind = 'images'")
    _validate_model(cfg)
    _validate_data(cfg)
    _validate_batch(cfg)
    if p.mode == "sdp":
        from slimpar.train.validate_sdp import validate_sdp

        validate_sdp(cfg)
    if p.mode == "pipeline":
        from slimpar.train.validate_pipeline import validate_pipeline

        validate_pipeline(cfg)


def _validate_model(cfg: Config) -> None:
    m = cfg.model
    if m.arch == "llama":
        from slimpar.models.llama import LlamaConfig
        from slimpar.train.build import llama_config

        _choice("model.size", m.size, tuple(LlamaConfig.SIZES))
        lc = llama_config(cfg)
        if cfg.data.seq_len > lc.max_seq_len:
            raise ConfigError(
                f"data.seq_len = {cfg.data.seq_len} is longer than the model's context "
                f"({lc.max_seq_len}); lower --data.seq_len or raise --model.max_seq_len")
        if lc.n_heads % lc.n_kv_heads:
            raise ConfigError(f"model.n_kv_heads = {lc.n_kv_heads} must divide the {lc.n_heads} heads")


def _validate_data(cfg: Config) -> None:
    d = cfg.data
    if d.kind == "text":
        _choice("data.corpus", d.corpus, ("shakespeare", "path"))
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
    from slimpar.data.sources import check_available

    check_available(cfg)


def _validate_batch(cfg: Config) -> None:
    t, p = cfg.train, cfg.parallel
    dp = p.workers if p.mode in ("ddp", "fsdp", "sdp", "single") else p.workers // max(cfg.pipeline.stages, 1)
    if p.mode == "sdp" and cfg.sdp.fsdp > 1:
        dp = p.workers  # every rank reads its own data; FSDP shards only the parameters
    if t.batch_size % (max(dp, 1) * t.grad_accum):
        raise ConfigError(
            f"train.batch_size = {t.batch_size} must be divisible by data-parallel workers ({dp}) "
            f"x train.grad_accum ({t.grad_accum})")
