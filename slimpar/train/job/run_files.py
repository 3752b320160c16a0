"""What a run folder keeps beside its metrics so that it can be used on its own: the tokenizer and
a config that names the real vocabulary size (the launcher writes ``config.toml`` before the tokenizer
exists, with ``model.vocab_size = 0`` meaning "take it from the tokenizer")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from slimpar.config import Config, to_toml
from slimpar.utils import write_text_atomic

TOKENIZER_FILE = "tokenizer.json"


def record_run_files(cfg: Config, data, out_dir: Path) -> None:
    """Rank 0, once the data exists: save the tokenizer and rewrite ``config.toml`` with the vocabulary."""
    if cfg.data.kind != "text":
        return
    tokenizer = getattr(data, "tokenizer", None)
    if tokenizer is not None:
        (out_dir / TOKENIZER_FILE).write_text(tokenizer.tokenizer.to_str())
    if not cfg.model.vocab_size and not cfg.model.init_from:  # init_from: the folder's vocabulary
        model = dataclasses.replace(cfg.model, vocab_size=data.vocab_size)
        write_text_atomic(out_dir / "config.toml", to_toml(dataclasses.replace(cfg, model=model)))
