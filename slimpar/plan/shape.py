"""The LLaMA sizes a plan's costs need, from the run config alone (no model is built)."""

from __future__ import annotations

from dataclasses import dataclass

from slimpar.config import Config


@dataclass(frozen=True)
class Shape:
    """The LLaMA's sizes the costs need."""

    dim: int
    vocab: int
    layers: int
    block_params: int
    block_flops: int  # per token, forward + backward
    head_flops: int  # per token, forward + backward (final norm and output head)
    params: int  # every parameter (a tied embedding once)

    @property
    def flops_per_token(self) -> int:
        return self.layers * self.block_flops + self.head_flops


def shape_of(cfg: Config) -> Shape:
    from slimpar.data.vocab import config_vocab_size
    from slimpar.train.build import llama_config

    lc = llama_config(cfg, vocab_size=config_vocab_size(cfg))
    d, hd = lc.dim, lc.dim // lc.n_heads
    block = d * lc.n_heads * hd * 2 + d * lc.n_kv_heads * hd * 2 + 3 * d * lc.ffn_dim + 2 * d
    head = lc.vocab_size * d + d
    params = lc.n_layers * block + head + (0 if lc.tie_embeddings else lc.vocab_size * d)
    return Shape(d, lc.vocab_size, lc.n_layers, block, 6 * block + 12 * lc.n_heads * hd * cfg.data.seq_len,
                 6 * head, params)
