"""The vocabulary a run's model will have, known from its config alone: no corpus is read and no tokenizer is built
or loaded. A memory prediction or floor needs this size only, and may run where the data is not installed
(``slimpar plan --memory`` on a laptop, ``bench gpu --predict`` on a bare GPU machine)."""

from __future__ import annotations

from slimpar.config import Config

GPT2_VOCAB = 50257  # GPT-2's BPE with <|endoftext|> at id 50256 (slimpar.data.tokenizer.gpt2_tokenizer)


def config_vocab_size(cfg: Config) -> int:
    """``model.vocab_size`` where set (the model takes it whatever the tokenizer has); GPT-2's fixed size with
    ``data.tokenizer = "gpt2"``; else the BPE's configured ``data.vocab_size``, which a BPE trained on Shakespeare
    reaches (on a small text of the user's a BPE may stop short of it, and a token file's vocabulary is its largest
    id + 1, which only reading it tells: the configured size is then an upper bound)."""
    if cfg.model.vocab_size:
        return cfg.model.vocab_size
    return GPT2_VOCAB if cfg.data.tokenizer == "gpt2" else cfg.data.vocab_size
