"""Text data: corpus → tokenizer → token streams → deterministic per-rank batches.

Training batches are a pure function of (seed, step): the global batch of a step is
``global_batch`` random windows drawn from a generator seeded with (seed, step), and rank ``r`` of
``world`` takes the contiguous slice ``[r*b, (r+1)*b)``, ``b = global_batch // world``. Hence a
resumed run sees exactly the batches a straight run sees, and one worker with batch B sees the
union of what W workers with B/W each see.

Validation streams: ``heldout`` (whole Shakespeare works, or the last 5% of user data) and
``wikipedia`` (out-of-domain prose, when ``data.ood = "wikipedia"``). Token streams are cached as
``<cache>/tokens/<tokenizer fingerprint>/<key>.npy`` so that worker processes tokenize only once.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from slimpar.data.cache import cached
from slimpar.data.corpora import (
    cache_root,
    heldout_names,
    sha256_texts,
    shakespeare_works,
    split_works,
    user_texts,
    wikipedia_articles,
)
from slimpar.data.errors import DataUnavailable
from slimpar.data.shares import batch_share
from slimpar.data.tokenizer import TextTokenizer, gpt2_tokenizer, train_bpe

if TYPE_CHECKING:
    from slimpar.config import DataConfig

HELDOUT_SEED = 0  # the held-out works do not follow train.seed, so val numbers compare across seeds
STREAM_FORMAT = 1  # bump when stream layout changes, so old caches are not reused
VAL_FRACTION = 0.05  # user data: the last 5% of the token stream validates
_BATCH_TAG = 0xDA7A  # keeps the data-order generator apart from other (seed, step) generators
Batch = tuple[torch.Tensor, torch.Tensor]


class TextData:
    """Token streams plus the tokenizer that made them (None for pre-tokenized data it cannot decode)."""

    def __init__(self, tokenizer: TextTokenizer | None, train_tokens: np.ndarray,
                 val_streams: dict[str, np.ndarray], seed: int = 0, vocab_size: int = 0,
                 heldout_works: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.train_tokens = train_tokens  # (N,) uint16 or int32, documents joined by <|endoftext|>
        self.val_streams = val_streams
        self.seed = seed
        self.vocab_size = vocab_size or (tokenizer.vocab_size if tokenizer else _max_id(train_tokens) + 1)
        self.heldout_works = list(heldout_works)
        # Bits per byte needs the bytes behind each id; unknown for foreign pre-tokenized ids.
        self.token_bytes: np.ndarray | None = tokenizer.token_bytes if tokenizer else None
        self.val_bytes: dict[str, int | None] = {  # bytes behind each stream's targets (all but the first id)
            name: self.target_bytes(torch.from_numpy(np.asarray(s[1:], dtype=np.int64)))
            for name, s in val_streams.items()
        }

    def train_batch(self, step: int, rank: int, world: int, global_batch: int, seq_len: int) -> Batch:
        """This rank's share of step ``step``'s global batch: x, y int64 (b, T), y = x shifted by one."""
        share = batch_share(step, rank, world, global_batch)  # ValueError unless 0 <= rank < world | global_batch
        n = len(self.train_tokens)
        if n < seq_len + 2:
            raise DataUnavailable(f"training stream: {n} tokens; seq_len {seq_len} needs {seq_len + 2}+")
        starts = step_generator(self.seed, step).integers(0, n - seq_len, size=global_batch)  # (B,)
        first = step * global_batch
        return _windows(self.train_tokens, starts[share.start - first:share.stop - first], seq_len)

    def val_batches(self, split: str, batch_size: int, max_batches: int, seq_len: int) -> list[Batch]:
        """Consecutive non-overlapping windows from the start of ``split`` (targets never repeat)."""
        stream = self.val_streams[split]
        n_windows = min(batch_size * max_batches, (len(stream) - 1) // seq_len)
        if n_windows < 1:
            raise DataUnavailable(f"validation stream {split!r} has {len(stream)} tokens, "
                                  f"fewer than seq_len + 1 = {seq_len + 1}")
        starts = np.arange(n_windows) * seq_len
        return [_windows(stream, starts[i:i + batch_size], seq_len) for i in range(0, n_windows, batch_size)]

    def target_bytes(self, y: torch.Tensor) -> int | None:
        """UTF-8 bytes the target ids stand for, or None when the ids' bytes are unknown."""
        if self.token_bytes is None:
            return None
        return int(self.token_bytes[y.reshape(-1).cpu().numpy()].sum())

    def bits_per_byte(self, sum_nll_nats: float, y: torch.Tensor) -> float | None:
        """nats / ln 2 / bytes of the targets: comparable across tokenizers (None if bytes unknown)."""
        nbytes = self.target_bytes(y)
        return sum_nll_nats / math.log(2) / nbytes if nbytes else None

    def describe(self) -> dict[str, object]:
        """A short summary for logs and result files."""
        return {"tokenizer": self.tokenizer.fingerprint if self.tokenizer else None,
                "vocab_size": self.vocab_size, "train_tokens": len(self.train_tokens),
                "val_tokens": {k: len(v) for k, v in self.val_streams.items()},
                "val_bytes": dict(self.val_bytes), "heldout_works": self.heldout_works}


def step_generator(seed: int, step: int) -> np.random.Generator:
    """The generator of step ``step``'s data order: a function of (seed, step) only."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return np.random.default_rng(np.random.SeedSequence([seed % 2**64, step, _BATCH_TAG]))


def _windows(stream: np.ndarray, starts: np.ndarray, seq_len: int) -> Batch:
    idx = starts[:, None] + np.arange(seq_len + 1)  # (b, T + 1)
    win = torch.from_numpy(np.asarray(stream[idx], dtype=np.int64))
    return win[:, :-1].contiguous(), win[:, 1:].contiguous()


def _max_id(tokens: np.ndarray) -> int:
    return int(tokens.max()) if len(tokens) else 0


# ---------------------------------------------------------------- streams and caches


def token_stream(tok: TextTokenizer, texts: Sequence[str], cache_dir: str | Path | None) -> np.ndarray:
    """``texts`` encoded and joined by ``<|endoftext|>``, cached under (tokenizer, texts) as .npy (verified, and
    rebuilt when damaged: :mod:`slimpar.data.cache`)."""
    key = hashlib.sha256(f"{tok.fingerprint}|{sha256_texts(texts)}|{STREAM_FORMAT}".encode()).hexdigest()[:16]
    path = cache_root(cache_dir) / "tokens" / tok.fingerprint / f"{key}.npy"

    def build() -> bytes:
        buf = io.BytesIO()
        np.save(buf, tok.encode_stream(texts))
        return buf.getvalue()

    cached(path, build, adopt=_whole_npy)
    return np.load(path, mmap_mode="r")  # shared page cache across worker processes


def _whole_npy(path: Path) -> bool:
    """Whether a ``.npy`` written before integrity records is whole: its header's array ends where the file does."""
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        return isinstance(array, np.memmap) and array.offset + array.nbytes == path.stat().st_size
    except (OSError, ValueError):
        return False


def load_token_file(path: str | Path) -> np.ndarray:
    """A pre-tokenized stream: ``.npy`` (1-D integer array) or ``.bin`` (raw uint16, nanoGPT style)."""
    p = Path(path)
    try:
        if p.suffix == ".bin":
            tokens = np.memmap(p, dtype=np.uint16, mode="r")
        else:
            tokens = np.load(p, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataUnavailable(f"cannot read tokens from {str(p)!r}: {e}") from None
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise DataUnavailable(f"{str(p)!r} must hold a 1-D integer array, got {tokens.dtype} {tokens.shape}")
    if len(tokens) and tokens.min() < 0:
        raise DataUnavailable(f"{str(p)!r} holds negative token ids")
    if len(tokens) and int(tokens.max()) >= (1 << 24):  # data.sources.MAX_TOKEN_ID: no vocabulary is that large
        raise DataUnavailable(f"{str(p)!r} holds token id {int(tokens.max())}, beyond any vocabulary (2**24)")
    return tokens


def split_tail(tokens: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) with val the last 5% of the stream (at least one window of ``seq_len + 1``)."""
    n_val = max(int(len(tokens) * VAL_FRACTION), seq_len + 1)
    if len(tokens) - n_val < seq_len + 2:
        raise DataUnavailable(f"{len(tokens)} tokens: too few for seq_len {seq_len} and a 5% validation tail")
    return tokens[:-n_val], tokens[-n_val:]


# ---------------------------------------------------------------- building from the config


def build_tokenizer(cfg: DataConfig, texts: Sequence[str]) -> TextTokenizer:
    """The configured tokenizer: GPT-2's, or a BPE trained on ``texts`` (cached)."""
    if cfg.tokenizer == "gpt2":
        return gpt2_tokenizer()
    return train_bpe(texts, cfg.vocab_size, cfg.cache_dir or None)


def _shakespeare(cfg: DataConfig) -> tuple[TextTokenizer, np.ndarray, dict[str, np.ndarray], list[str]]:
    works = shakespeare_works()
    train_texts, held_texts = split_works(works, cfg.heldout_works, HELDOUT_SEED)
    tok = build_tokenizer(cfg, train_texts)  # trained without the held-out works
    vals = {"heldout": token_stream(tok, held_texts, cfg.cache_dir)} if held_texts else {}
    names = heldout_names(works, cfg.heldout_works, HELDOUT_SEED)
    return tok, token_stream(tok, train_texts, cfg.cache_dir), vals, names


def _user_path(cfg: DataConfig) -> tuple[TextTokenizer | None, np.ndarray, dict[str, np.ndarray]]:
    path = Path(cfg.path).expanduser()
    if path.is_file() and path.suffix in (".npy", ".bin"):
        tokens = load_token_file(path)
        # Only GPT-2's fixed vocabulary can stand behind foreign ids; a BPE would need text to train on.
        tok = gpt2_tokenizer() if cfg.tokenizer == "gpt2" else None
        if tok is not None and _max_id(tokens) >= tok.vocab_size:
            tok = None  # these are not GPT-2 ids: no decoding, no bits per byte
    else:
        texts = user_texts(path, cfg.encoding)
        tok = build_tokenizer(cfg, texts)  # trained on all of the user's text, tail included
        tokens = token_stream(tok, texts, cfg.cache_dir)
    train, val = split_tail(tokens, cfg.seq_len)
    return tok, train, {"heldout": val}


def build_text_data(cfg: DataConfig, seed: int) -> TextData:
    """Everything a text run reads, from ``cfg`` (slimpar.config.DataConfig) and the run seed."""
    names: list[str] = []
    if cfg.corpus == "shakespeare":
        tok, train, vals, names = _shakespeare(cfg)
    elif cfg.corpus == "path":
        tok, train, vals = _user_path(cfg)
    else:
        raise DataUnavailable(f"unknown data.corpus {cfg.corpus!r}; use shakespeare or path")
    if cfg.ood == "wikipedia":
        if tok is None:
            raise DataUnavailable("data.ood = 'wikipedia' needs a tokenizer for these pre-tokenized ids; "
                                  "use --data.ood none (or --data.tokenizer gpt2 for GPT-2 ids)")
        vals["wikipedia"] = token_stream(tok, [wikipedia_articles(cfg.cache_dir or None)], cfg.cache_dir)
    vocab = tok.vocab_size if tok else max([_max_id(train), *(_max_id(v) for v in vals.values())]) + 1
    return TextData(tok, train, vals, seed=seed, vocab_size=vocab, heldout_works=names)
