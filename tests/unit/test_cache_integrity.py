"""Caches that cannot lie (issue 40): each cache kind (BPE tokenizer, token stream, Wikipedia text) carries its size
and sha256; a truncated or altered file is detected, rebuilt once with a one-line note, and a rebuild that fails
names the file (slimpar/data/cache.py)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest

from slimpar.data import cache as cache_module
from slimpar.data.corpora import shakespeare_works, wikipedia_articles
from slimpar.data.errors import DataUnavailable
from slimpar.data.text import token_stream
from slimpar.data.tokenizer import train_bpe

KINDS = ("tokenizer", "tokens", "wikipedia")


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [text[:200_000] for _, text in shakespeare_works()[:2]]


def _load(kind: str, texts: list[str], cache: Path):
    """What the data layer reads for ``kind``, built or verified in ``cache``: comparable content."""
    tok = train_bpe(texts, 300, cache)
    if kind == "tokenizer":
        return tok.tokenizer.to_str()
    if kind == "tokens":
        return np.asarray(token_stream(tok, texts, cache)).tolist()
    return wikipedia_articles(cache)


def _file(kind: str, cache: Path) -> Path:
    pattern = {"tokenizer": "tokenizers/*.json", "tokens": "tokens/*/*.npy", "wikipedia": "wikipedia/*.txt"}[kind]
    (path,) = cache.glob(pattern)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory, texts) -> dict[str, tuple[Path, object, bytes]]:
    """Each kind built once in a module cache: (its file, what it loads as, its bytes)."""
    cache = tmp_path_factory.mktemp("cache")
    out = {}
    for kind in KINDS:
        content = _load(kind, texts, cache)
        path = _file(kind, cache)
        out[kind] = (path, content, path.read_bytes())
    return out


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:len(data) // 2])
    else:  # one byte changed, the size kept: only the hash can tell
        i = len(data) * 3 // 4
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x20]) + data[i + 1:])


@pytest.mark.parametrize("how", ["truncated", "altered"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_cache_file_is_rebuilt_once_with_a_note(kind, how, built, texts, capsys):
    path, content, original = built[kind]
    cache = path.parents[1] if kind != "tokens" else path.parents[2]
    _damage(path, how)
    capsys.readouterr()
    assert _load(kind, texts, cache) == content
    notes = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("note: cache file")]
    assert len(notes) == 1 and str(path) in notes[0] and "rebuilding it" in notes[0], notes
    assert ("truncated" if how == "truncated" else "sha256") in notes[0]
    assert path.read_bytes() == original
    record = json.loads(path.with_name(path.name + ".integrity").read_text())
    assert record["size"] == len(original)
    _load(kind, texts, cache)  # verified now: no second note
    assert "note:" not in capsys.readouterr().out


def test_a_whole_file_without_a_record_is_adopted_and_a_cut_one_rebuilt(built, texts, capsys):
    """Caches written before integrity records: a .npy whose header matches its length is kept (its record
    written, no note); a cut one is rebuilt."""
    path, content, original = built["tokens"]
    cache, record = path.parents[2], path.with_name(path.name + ".integrity")
    record.unlink()
    capsys.readouterr()
    assert _load("tokens", texts, cache) == content and record.is_file()
    assert "note:" not in capsys.readouterr().out
    record.unlink()
    path.write_bytes(original[:-100])
    assert _load("tokens", texts, cache) == content
    assert "has no integrity record" in capsys.readouterr().out and path.read_bytes() == original


def test_a_rebuild_that_fails_names_the_file(built, texts, monkeypatch):
    path, content, _ = built["tokens"]
    _damage(path, "truncated")

    def full_disk(target, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_module, "_write_atomic", full_disk)
    with pytest.raises(DataUnavailable, match="could not be rebuilt") as e:
        _load("tokens", texts, path.parents[2])
    assert str(path) in str(e.value) and "No space left on device" in str(e.value)
    monkeypatch.undo()
    assert _load("tokens", texts, path.parents[2]) == content  # rebuilt once the disk has room
