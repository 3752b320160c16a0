"""LLaMA-style decoder: RMSNorm, rotary position embeddings, SwiGLU, optional grouped-query attention.

Single-device code. Blocks live in an ``nn.ModuleDict`` keyed "0".."L-1" and the forward skips an
absent embedding, final norm or head, so pipeline stages and block subnetworks are plain deletions
(``del model.layers["3"]``, ``model.output = None``) that keep every parameter name stable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaConfig:
    """The shape of a LLaMA-style decoder: vocabulary, width, depth, heads (GQA when ``n_kv_heads`` < ``n_heads``)."""

    vocab_size: int = 4096
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int = 176  # SwiGLU hidden width (d_ff)
    max_seq_len: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    init_std: float = 0.02

    SIZES: ClassVar[dict[str, dict[str, int]]] = {
        "tiny": dict(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=176, max_seq_len=256),
        # the long-regime quality benchmark's model (slimpar bench quality): flat loss within ~2k steps on 1 core
        "mini": dict(dim=128, n_layers=8, n_heads=4, n_kv_heads=2, ffn_dim=352, max_seq_len=256),
        "small": dict(dim=256, n_layers=8, n_heads=8, n_kv_heads=4, ffn_dim=688, max_seq_len=512),
        "134m": dict(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, ffn_dim=2048, max_seq_len=1024),
        "500m": dict(dim=1280, n_layers=24, n_heads=20, n_kv_heads=20, ffn_dim=3456, max_seq_len=1024),
        "1b": dict(dim=2048, n_layers=18, n_heads=16, n_kv_heads=8, ffn_dim=5632, max_seq_len=2048),
    }

    @classmethod
    def named(cls, size: str, **overrides) -> LlamaConfig:
        """A named size ("tiny", "mini", "small", "134m", "500m", "1b") with optional field overrides."""
        if size not in cls.SIZES:
            raise ValueError(f"unknown LLaMA size {size!r}; choose from {', '.join(cls.SIZES)}")
        return replace(cls(**cls.SIZES[size]), **overrides)

    @classmethod
    def tiny(cls, **overrides) -> LlamaConfig:
        return cls.named("tiny", **overrides)

    @classmethod
    def small(cls, **overrides) -> LlamaConfig:
        return cls.named("small", **overrides)


    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (T, head_dim) in the half-split layout used by Hugging Face's LLaMA, computed on the host in
    float32 (the same numbers whatever the device) and placed on the default device (meta in a plan's model)."""
    host = {"dtype": torch.float32, "device": "cpu"}
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, **host) / head_dim))
    freqs = torch.outer(torch.arange(max_seq_len, **host), inv_freq)  # (T, hd/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (T, hd)
    device = torch.get_default_device()
    return emb.cos().to(device), emb.sin().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, hd) by position; the second half of each head pairs with the first."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.n_kv_heads != self.n_heads:
            rep = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x). Hidden unit h is row h of w1 and w3 and column h of w2."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)  # gate
        self.w3 = nn.Linear(dim, hidden, bias=False)  # up
        self.w2 = nn.Linear(hidden, dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg.dim, cfg.ffn_dim)
        # Scales both residual branches; 1.0 in training. Evaluation of a block subnetwork's full
        # model may set it to the survival probability (stochastic-depth style rescaling).
        self.residual_scale = 1.0

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = h + self.residual_scale * self.attention(self.attention_norm(h), cos, sin)
        return h + self.residual_scale * self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """Decoder-only LM. ``forward(tokens)`` returns logits (B, T, V); a stage without a head
    returns the residual stream (B, T, D), and one without an embedding takes it as input."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output: nn.Linear | None = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            # output projections of residual branches scaled down with depth (GPT-2 style)
            scale = 1 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("wo.weight", "w2.weight")) else 1
            nn.init.normal_(p, std=std * scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x  # (B, T, D)
        cos, sin = self.rope_cos[:T].to(h.dtype), self.rope_sin[:T].to(h.dtype)
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h  # (B, T, V) or (B, T, D)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
