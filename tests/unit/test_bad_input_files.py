"""Malformed SDP plans (``--sdp.assignment explicit`` mask files), data files and image folders: exit 2, one
message, nothing written (tests/unit/test_bad_input.py says how the cases run)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.bad_input import T, expect_exit_2, npy, write
from tests.helpers import TINY

# ---------------------------------------------------------------- SDP plans: --sdp.assignment explicit

MASK_CASES: list[tuple[str, str, bytes | str | None, str | tuple[str, ...]]] = [
    ("missing", "mask.txt", None, ("SDP plan", "mask.txt")),
    ("empty", "mask.txt", "", ("SDP plan", "0/1")),
    ("only-comments", "mask.txt", "# nothing\n", ("SDP plan", "0/1")),
    ("not-binary-values", "mask.txt", "1 0 2 0\n0 1 0 1\n", ("SDP plan", "0/1")),
    ("letters", "mask.txt", "a b c d\ne f g h\n", ("SDP plan", "0/1")),
    ("ragged-rows", "mask.txt", "1 0 1\n0 1 0 1\n", ("SDP plan", "equal-length")),
    ("too-many-rows", "mask.txt", "1 0 1 0\n0 1 0 1\n1 1 1 1\n", "SDP plan"),
    ("too-few-columns", "mask.txt", "1 0 1\n0 1 0\n", "SDP plan"),
    ("worker-holds-nothing", "mask.txt", "0 0 0 0\n1 1 1 1\n", ("SDP plan", "hold no component")),
    ("component-held-by-nobody", "mask.txt", "1 0 1 0\n0 0 1 1\n", ("SDP plan", "min_holders")),
    ("binary-file", "mask.txt", bytes(range(128, 256)) * 3, ("SDP plan", "mask.txt")),
    ("npy-garbage", "mask.npy", b"\x93NUMPY garbage", ("SDP plan", "mask.npy")),
    ("npy-1d", "mask.npy", npy(np.array([1, 0, 1, 0])), ("SDP plan", "0/1")),
    ("npy-floats", "mask.npy", npy(np.full((2, 4), 0.5)), ("SDP plan", "0/1")),
    ("npy-object-pickle", "mask.npy", npy(np.array([[1, 0], "x"], dtype=object)), ("SDP plan", "mask.npy")),
    ("a-folder", "maskdir", b"", ("SDP plan", "maskdir")),
]


@pytest.mark.parametrize("name, file, content, match", MASK_CASES, ids=[c[0] for c in MASK_CASES])
def test_bad_mask_file(name, file, content, match, tmp_path, capsys):
    path = tmp_path / file
    if name == "a-folder":
        path.mkdir()
    elif content is not None:
        write(path, content)
    argv = ["train", "--config", T, "--out", str(tmp_path / "run"), "--parallel.mode", "sdp",
            "--parallel.workers", "2", "--sdp.assignment", "explicit", "--sdp.mask_file", str(path)]
    expect_exit_2(argv, tmp_path, capsys, match)


def test_good_mask_file_passes(tmp_path):
    """The baseline the mask cases differ from: a valid 2 x 4 block mask is accepted."""
    from slimpar.train.validate.checks import load_run_config

    mask = write(tmp_path / "mask.txt", "1 1 0 0\n0 0 1 1\n")
    load_run_config(TINY, ["--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.assignment", "explicit",
                           "--sdp.mask_file", str(mask)])


# ---------------------------------------------------------------- data files: --data.corpus path

TEXT = "To be, or not to be, that is the question.\n" * 8  # 344 bytes: enough for seq_len 64


def _data_setup(name: str, d: Path) -> Path:
    """Create the bad data for case ``name`` under ``d``; return the --data.path."""
    rng = np.random.default_rng(0)
    cases = {
        "missing": lambda: d / "nope.txt",
        "empty-file": lambda: write(d / "e.txt", ""),
        "one-byte": lambda: write(d / "one.txt", "a"),
        "too-short-text": lambda: write(d / "short.txt", "Hello there.\n"),
        "empty-folder": lambda: (d / "texts").mkdir(parents=True) or d / "texts",
        "folder-without-txt": lambda: write(d / "texts" / "notes.md", TEXT).parent,
        "folder-of-empty-txt": lambda: write(d / "texts" / "a.txt", "").parent,
        "binary-text": lambda: write(d / "bin.txt", rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()),
        "latin-1-text": lambda: write(d / "fr.txt", ("Caf\xe9 cr\xe8me. " * 40).encode("latin-1")),
        "utf-16-text": lambda: write(d / "w.txt", TEXT.encode("utf-16")),
        "utf-16le-no-bom": lambda: write(d / "w.txt", TEXT.encode("utf-16-le")),
        "nul-bytes": lambda: write(d / "n.txt", TEXT + "\x00\x00" + TEXT),
        "binary-in-folder": lambda: (write(d / "t" / "a.txt", TEXT), write(d / "t" / "b.txt", b"\xff\xfe\x00" * 99))[
            0].parent,
        "npy-garbage": lambda: write(d / "tok.npy", b"this is not numpy" * 20),
        "npy-bad-header": lambda: write(d / "tok.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': <i8}    \n" + b"0" * 400),
        "npy-2d": lambda: write(d / "tok.npy", npy(np.zeros((40, 40), dtype=np.int64))),
        "npy-floats": lambda: write(d / "tok.npy", npy(np.zeros(1000, dtype=np.float32))),
        "npy-object-pickle": lambda: write(d / "tok.npy", npy(np.array([1, "x"] * 200, dtype=object))),
        "npy-too-short": lambda: write(d / "tok.npy", npy(np.arange(10, dtype=np.int32))),
        "npy-negative-ids": lambda: write(d / "tok.npy", npy(np.arange(-5, 995, dtype=np.int32))),
        "npy-truncated": lambda: write(d / "tok.npy", npy(np.arange(1000, dtype=np.int64))[:-3000]),
        "bin-odd-size": lambda: write(d / "tok.bin", b"\x01" * 1001),
        "bin-too-short": lambda: write(d / "tok.bin", np.arange(20, dtype=np.uint16).tobytes()),
    }
    return cases[name]()


DATA_CASES: list[tuple[str, list[str], str | tuple[str, ...]]] = [
    ("missing", [], ("does not exist", "text file")),
    ("empty-file", [], "is empty"),
    ("one-byte", [], ("1 bytes", "--data.seq_len")),
    ("too-short-text", [], ("bytes of text", "lower --data.seq_len")),
    ("empty-folder", [], "without .txt"),
    ("folder-without-txt", [], "without .txt"),
    ("folder-of-empty-txt", [], ("0 bytes", "give more text")),
    ("binary-text", [], ("not valid utf-8", "--data.encoding")),
    ("latin-1-text", [], ("not valid utf-8", "--data.encoding latin-1")),
    ("utf-16-text", [], ("utf-8", "--data.encoding")),
    ("utf-16le-no-bom", [], ("NUL", "--data.encoding utf-16")),
    ("nul-bytes", [], ("NUL", "binary")),
    ("binary-in-folder", [], ("b.txt", "--data.encoding")),
    ("latin-1-text", ["--data.encoding", "klingon"], ("data.encoding", "latin-1")),
    ("latin-1-text", ["--data.encoding", "ascii"], ("not valid ascii", "--data.encoding")),
    ("npy-garbage", [], ("not a valid .npy", "np.save")),
    ("npy-bad-header", [], "not a valid .npy"),
    ("npy-2d", [], ("1-D integer array", "(40, 40)")),
    ("npy-floats", [], ("1-D integer array", "float32")),
    ("npy-object-pickle", [], ("tok.npy", "1-D integer")),
    ("npy-too-short", [], ("10 tokens", "--data.seq_len")),
    ("npy-negative-ids", [], "negative token ids"),
    ("npy-truncated", [], ("tok.npy", "cannot read")),
    ("bin-odd-size", [], ("uint16", "1001 bytes")),
    ("bin-too-short", [], ("20 tokens", "--data.seq_len")),
    ("npy-too-short", ["--data.ood", "wikipedia"], ("--data.ood none",)),
]


@pytest.mark.parametrize("name, extra, match", DATA_CASES,
                         ids=[c[0] + ("".join(c[1]).replace("--data.", "-") if c[1] else "") for c in DATA_CASES])
def test_bad_data_file(name, extra, match, tmp_path, capsys):
    path = _data_setup(name, tmp_path / "data")
    argv = ["train", "--config", T, "--out", str(tmp_path / "run"), "--data.corpus", "path",
            "--data.path", str(path), "--data.ood", "none", *extra]
    expect_exit_2(argv, tmp_path, capsys, match)


def test_latin_1_text_with_its_encoding_passes(tmp_path):
    """The fix the message names works: the same Latin-1 file validates with --data.encoding latin-1."""
    from slimpar.train.validate.checks import load_run_config

    path = _data_setup("latin-1-text", tmp_path)
    load_run_config(TINY, ["--data.corpus", "path", "--data.path", str(path), "--data.ood", "none",
                           "--data.encoding", "latin-1"])


IMAGE_CASES: list[tuple[str, list[str], str | tuple[str, ...]]] = [
    ("fmnist-empty-folder", ["--data.image_set", "fashion_mnist", "--data.image_dir", "{d}"],
     ("Fashion-MNIST not found", "apt-get install")),
    ("cifar-empty-folder", ["--data.image_set", "cifar10", "--data.image_dir", "{d}"],
     ("data_batch_1", "--data.image_dir")),
    ("cifar100-missing-folder", ["--data.image_set", "cifar100", "--data.image_dir", "{d}/nope"], "--data.image_dir"),
]


@pytest.mark.parametrize("name, extra, match", IMAGE_CASES, ids=[c[0] for c in IMAGE_CASES])
def test_bad_image_folder(name, extra, match, tmp_path, capsys):
    (tmp_path / "images").mkdir()
    extra = [a.replace("{d}", str(tmp_path / "images")) for a in extra]
    argv = ["train", "--config", "resnet_tiny", "--out", str(tmp_path / "run"), *extra]
    expect_exit_2(argv, tmp_path, capsys, match)


