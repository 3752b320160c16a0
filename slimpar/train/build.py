"""Build the pieces of a run from its config: data, model, loss, optimizer and schedule."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from slimpar.optim.adamw import adamw_kernels

if TYPE_CHECKING:
    from slimpar.config import Config


def build_data(cfg: Config):
    """TextData or ImageData, both with ``train_batch(step, rank, world, global_batch)``-style APIs."""
    if cfg.data.kind == "text":
        from slimpar.data.text import build_text_data

        return build_text_data(cfg.data, seed=cfg.train.seed)
    from slimpar.data.images import ImageData

    return ImageData(cfg.data.image_set, image_dir=cfg.data.image_dir, augment=cfg.data.augment,
                     seed=cfg.train.seed)


def llama_config(cfg: Config, vocab_size: int | None = None):
    """The LlamaConfig a run config asks for; the vocabulary comes from the tokenizer unless set."""
    from slimpar.models.llama import LlamaConfig

    m = cfg.model
    if m.init_from:  # the folder's shape wins over model.size and friends
        return _hf_shape(m.init_from, vocab_size)
    over: dict = {"tie_embeddings": m.tie_embeddings}
    if m.max_seq_len:
        over["max_seq_len"] = m.max_seq_len
    if m.n_kv_heads:
        over["n_kv_heads"] = m.n_kv_heads
    if m.n_layers:
        over["n_layers"] = m.n_layers
    over["vocab_size"] = m.vocab_size or vocab_size or cfg.data.vocab_size
    return LlamaConfig.named(m.size, **over)


def _hf_shape(folder: str, data_vocab: int | None):
    from slimpar.config import ConfigError
    from slimpar.models.hf_llama import HFFormatError, read_hf_config

    try:
        lc = read_hf_config(folder)
    except HFFormatError as e:
        raise ConfigError(f"model.init_from: {e}") from None
    if data_vocab is not None and data_vocab > lc.vocab_size:
        raise ConfigError(f"model.init_from: the data's tokenizer has {data_vocab} tokens but {folder} has only "
                          f"{lc.vocab_size} embeddings; train with that model's tokenizer or a smaller "
                          "--data.vocab_size")
    return lc


def build_model(cfg: Config, data=None) -> nn.Module:
    """The full single-device model, initialised from ``train.seed`` (identical on every rank)."""
    torch.manual_seed(cfg.train.seed)
    m = cfg.model
    if m.arch == "llama":
        from slimpar.models.llama import Llama

        vocab = data.vocab_size if data is not None else None
        model = Llama(llama_config(cfg, vocab_size=vocab))
        if m.init_from and not model.norm.weight.is_meta:
            from slimpar.models.hf_llama import load_hf_weights

            load_hf_weights(model, m.init_from)
        return model
    num_classes = data.num_classes if data is not None else m.num_classes
    channels = data.channels if data is not None else m.in_channels
    if m.arch in ("resnet18", "wrn18"):
        from slimpar.models.resnet import ResNet, ResNetConfig

        w = m.width * (2 if m.arch == "wrn18" else 1)
        return ResNet(ResNetConfig(widths=(w, 2 * w, 4 * w, 8 * w), num_classes=num_classes, in_channels=channels))
    from slimpar.models.swin import Swin, SwinConfig

    size = data.size if data is not None else 32
    return Swin(SwinConfig.tiny(img_size=size, in_channels=channels, num_classes=num_classes, embed_dim=m.embed_dim))


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy for (B, T, V) LM logits or (B, C) class logits."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def train_loss(cfg: Config | None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The training loss, compiled on its own where ``train.compile_scope`` is ``loss``."""
    if cfg is not None and cfg.train.compile and cfg.train.compile_scope == "loss":
        from slimpar.parallel.compile import compiled_loss

        return compiled_loss(loss_fn, cfg.train.compile_backend)
    return loss_fn


def forward_loss(cfg: Config | None, module: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``loss(module(x), y)``: one compiled graph where ``train.compile_scope`` is ``model``, else the module's
    forward (its blocks compiled or not) and :func:`train_loss`."""
    if cfg is not None and cfg.train.compile and cfg.train.compile_scope == "model":
        from slimpar.parallel.compile import compiled_forward_loss

        return compiled_forward_loss(module, loss_fn, cfg.train.compile_backend)
    loss = train_loss(cfg)
    return lambda x, y: loss(module(x), y)


def compiles_blocks(cfg: Config) -> bool:
    """Whether each block is compiled on its own (``train.compile`` in the scopes blocks and loss)."""
    return cfg.train.compile and cfg.train.compile_scope != "model"


def build_optimizer(named_params: list[tuple[str, nn.Parameter]], cfg: Config) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norms, biases or 1-D scales)."""
    t = cfg.train
    decay = [p for _, p in named_params if p.dim() >= 2]
    no_decay = [p for _, p in named_params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=1e-8, **adamw_kernels(decay + no_decay))


def lr_at(step: int, cfg: Config, total_steps: int) -> float:
    """Linear warm-up to ``train.lr``, then cosine decay to ``lr * min_lr_ratio`` at the last step."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(total_steps - t.warmup_steps, 1)
    progress = min((step - t.warmup_steps) / span, 1.0)
    floor = t.lr * t.min_lr_ratio
    return floor + 0.5 * (t.lr - floor) * (1 + math.cos(math.pi * progress))


def total_steps(cfg: Config) -> int:
    """Steps of the run; FLOP-matched SDP runs 1/keep times as many."""
    if cfg.parallel.mode == "sdp" and cfg.sdp.flop_matched:
        keeps = cfg.sdp.keep_per_worker or [cfg.sdp.keep]
        return int(round(cfg.train.steps / (sum(keeps) / len(keeps))))
    return cfg.train.steps


AUTO_EVAL_MIN_STEPS = 500  # eval.every = 0: runs this long evaluate on the way, shorter ones only at the end


def final_eval_config(cfg: Config) -> Config:
    """``cfg`` with the end-of-run evaluation's batches: ``eval.final_tokens`` per text split, in
    ``eval.batch_size`` sequences per batch (a split shorter than that is read whole); ``cfg`` when 0."""
    e = cfg.eval
    if not e.final_tokens or cfg.data.kind != "text":
        return cfg
    batches = -(-e.final_tokens // (e.batch_size * cfg.data.seq_len))
    return dataclasses.replace(cfg, eval=dataclasses.replace(e, batches=max(batches, 1)))


def eval_every(cfg: Config, total: int) -> int:
    """Steps between validations during training (0: only at the end). ``eval.every = 0`` (auto) gives about
    10% of a run of at least :data:`AUTO_EVAL_MIN_STEPS` steps, a multiple of ``log.every`` (evaluations land
    on logged steps); ``-1`` evaluates only at the end."""
    every = cfg.eval.every
    if every:
        return max(every, 0)
    if total < AUTO_EVAL_MIN_STEPS:
        return 0
    log = cfg.log.every
    return max(total // 10 // log, 1) * log
