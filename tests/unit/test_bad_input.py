"""Malformed inputs (issue 11, item 8): each gives exit 2, one message naming the problem (and the fix),
no traceback, and nothing written (the folder tree is compared before and after).

Every case runs in-process through ``slimpar.cli.main`` (which returns 2 on a ConfigError; argparse's own
usage errors exit 2 through SystemExit). Numeric ranges (NaN, inf, negative sizes...) are in
tests/unit/test_validate_numbers.py and not repeated here; a few end-to-end subprocess cases are in
tests/distributed/test_bad_input_cli.py. Categories: config files, command line, SDP plans, data files,
run folders (eval, export) and checkpoints (``train --resume``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from slimpar.cli import main
from tests.helpers import TINY

T = str(TINY)
TINY_RUN_ARGS = ["--train.steps", "3", "--eval.batches", "2", "--data.ood", "none"]  # conftest's tiny_run


def tree(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` with a digest of its content (folders: '<dir>')."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = "<dir>" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def expect_exit_2(argv: list[str], root: Path, capsys, match: str | tuple[str, ...]) -> str:
    """Run the CLI in-process; assert exit 2, no traceback, a message containing ``match``, nothing written."""
    before = tree(root)
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse usage errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, f"exit {rc} for {argv}; stderr:\n{err}"
    assert "Traceback" not in err, err
    for m in (match,) if isinstance(match, str) else match:
        assert m.lower() in err.lower(), f"{m!r} not in:\n{err}"
    assert tree(root) == before, "files were written"
    return err


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


# ---------------------------------------------------------------- config files (TOML)

TOML_CASES: list[tuple[str, bytes | str, str | tuple[str, ...]]] = [
    ("unclosed-table", "[train\nsteps = 1\n", "not valid TOML"),
    ("missing-value", "[train]\nsteps =\n", "not valid TOML"),
    ("duplicate-key", "[train]\nsteps = 1\nsteps = 2\n", "not valid TOML"),
    ("duplicate-table", "[train]\nsteps = 1\n[train]\nlr = 0.1\n", "not valid TOML"),
    ("unquoted-string", "[model]\narch = llama\n", "not valid TOML"),
    ("nul-byte", b"[train]\nsteps = 1\x00\n", "not valid TOML"),
    ("latin-1", "# d\xe9j\xe0 vu\n[train]\nsteps = 2\n".encode("latin-1"), ("not UTF-8", "UTF-8")),
    ("utf-16", "[train]\nsteps = 2\n".encode("utf-16"), "not UTF-8"),
    ("binary", bytes(range(256)) * 4, "not UTF-8"),
    ("list-for-int", "[train]\nsteps = [1, 2]\n", ("train.steps", "list")),
    ("list-for-float", "[train]\nlr = [0.1]\n", ("train.lr", "list")),
    ("list-for-str", '[parallel]\nmode = ["sdp"]\n', ("parallel.mode", "list")),
    ("list-for-bool", "[model]\ntie_embeddings = [true]\n", ("model.tie_embeddings", "true or false")),
    ("nested-list", "[sdp]\nkeep_per_worker = [[0.5], [0.5]]\n", ("sdp.keep_per_worker", "list")),
    ("list-of-str-for-floats", '[sdp]\nkeep_per_worker = [0.5, "half"]\n', ("sdp.keep_per_worker", "float")),
    ("table-for-int", "[train.steps]\nx = 1\n", ("train.steps", "not a section")),
    ("inline-table-for-float", "[train]\nlr = {value = 0.1}\n", ("train.lr", "not a section")),
    ("table-for-str", "[model.arch]\nname = 'llama'\n", ("model.arch", "not a section")),
    ("scalar-for-section", "model = 3\n", ("'model' is a section",)),
    ("scalar-for-subsection", "[pipeline]\nrvq = 5\n", ("pipeline.rvq", "section")),
    ("unknown-section", "[trainer]\nsteps = 3\n", ("unknown config key 'trainer'", "known keys")),
    ("unknown-key", "[train]\nstepz = 3\n", ("unknown config key 'train.stepz'", "steps")),
    ("unknown-subkey", "[pipeline.rvq]\nlevel = 2\n", ("pipeline.rvq.level", "levels")),
    ("top-level-key", "steps = 3\n", "unknown config key 'steps'"),
    ("str-for-int", '[train]\nsteps = "ten"\n', ("train.steps", "expected int")),
    ("float-for-int", "[train]\nsteps = 1.5\n", ("train.steps", "expected int")),
    ("bool-for-int", "[train]\nsteps = true\n", ("train.steps", "expected int")),
    ("inf-for-int", "[train]\nsteps = inf\n", ("train.steps", "expected int")),
    ("str-for-float", '[train]\nlr = "fast"\n', ("train.lr", "expected float")),
    ("str-for-bool", '[model]\ntie_embeddings = "maybe"\n', ("model.tie_embeddings", "true or false")),
    ("int-for-str", "[model]\narch = 3\n", ("model.arch", "expected a string")),
    ("date-for-int", "[train]\nsteps = 2024-01-01\n", ("train.steps", "expected int")),
    ("str-for-subsection-int", '[pipeline.rvq]\nlevels = "x"\n', ("pipeline.rvq.levels", "expected int")),
    ("bad-choice-mode", '[parallel]\nmode = "turbo"\n', ("parallel.mode", "not one of")),
    ("bad-choice-arch", '[model]\narch = "gpt"\n', ("model.arch", "not one of")),
    ("bad-choice-dtype", '[train]\ndtype = "fp16"\n', ("train.dtype", "not one of")),
    ("bad-choice-size", '[model]\nsize = "huge"\n', ("model.size", "not one of")),
]


@pytest.mark.parametrize("name, content, match", TOML_CASES, ids=[c[0] for c in TOML_CASES])
def test_bad_config_file(name, content, match, tmp_path, capsys):
    cfg = write(tmp_path / "bad.toml", content)
    expect_exit_2(["train", "--config", str(cfg), "--out", str(tmp_path / "run")], tmp_path, capsys, match)


CONFIG_PATH_CASES: list[tuple[str, Callable[[Path], str], str | tuple[str, ...]]] = [
    ("missing-file", lambda d: str(d / "nope.toml"), ("not found", "packaged configs")),
    ("a-folder", lambda d: str(d), ("not found", "TOML file")),
    ("unknown-packaged-name", lambda d: "llama_huge", ("not found", "llama_tiny")),
    ("packaged-name-with-folder", lambda d: "configs/llama_huge.toml", ("not found", "llama_tiny")),
]


@pytest.mark.parametrize("name, path, match", CONFIG_PATH_CASES, ids=[c[0] for c in CONFIG_PATH_CASES])
def test_bad_config_path(name, path, match, tmp_path, capsys):
    expect_exit_2(["train", "--config", path(tmp_path), "--out", str(tmp_path / "run")], tmp_path, capsys, match)


# ---------------------------------------------------------------- command line

CLI_CASES: list[tuple[str, list[str], str | tuple[str, ...]]] = [
    ("unknown-flag", ["train", "--config", T, "--bogus"], ("unexpected argument '--bogus'", "--section.key")),
    ("positional", ["train", "--config", T, "extra"], ("unexpected argument 'extra'",)),
    ("flag-without-dot", ["train", "--config", T, "--train", "3"], ("unexpected argument '--train'",)),
    ("missing-override-value", ["train", "--config", T, "--train.steps"], "--train.steps needs a value"),
    ("empty-override-value", ["train", "--config", T, "--train.steps="], ("train.steps", "expected int")),
    ("word-for-int", ["train", "--config", T, "--train.steps", "ten"], ("train.steps", "expected int")),
    ("float-string-for-int", ["train", "--config", T, "--train.steps", "1e3"], ("train.steps", "expected int")),
    ("word-for-float", ["train", "--config", T, "--train.lr", "fast"], ("train.lr", "expected float")),
    ("word-for-bool", ["train", "--config", T, "--model.tie_embeddings", "maybe"], "true or false"),
    ("unknown-section", ["train", "--config", T, "--trainer.steps", "3"], "unknown config key 'trainer'"),
    ("unknown-key", ["train", "--config", T, "--train.stepz", "3"], "unknown config key 'train.stepz'"),
    ("key-below-a-value", ["train", "--config", T, "--train.steps.x", "3"], ("train.steps", "not a section")),
    ("value-for-section", ["train", "--config", T, "--pipeline.rvq", "3"], ("pipeline.rvq", "section")),
    ("empty-key", ["train", "--config", T, "--train.", "3"], "unknown config key 'train.'"),
    ("out-without-value", ["train", "--config", T, "--out"], ("--out", "expected one argument")),
    ("config-without-value", ["train", "--config"], ("--config", "expected one argument")),
    ("bad-mode", ["train", "--config", T, "--parallel.mode", "turbo"], ("parallel.mode", "not one of")),
    ("single-with-2-workers", ["train", "--config", T, "--parallel.workers", "2"], ("single", "--parallel.mode")),
    ("too-many-gpus", ["train", "--config", T, "--parallel.mode", "ddp", "--parallel.workers", "64",
                       "--parallel.device", "cuda"], ("cuda", "GPUs")),
    ("bad-backend", ["train", "--config", T, "--parallel.backend", "mpi"], ("parallel.backend", "not one of")),
    ("batch-not-divisible", ["train", "--config", T, "--parallel.mode", "ddp", "--parallel.workers", "2",
                             "--train.batch_size", "7"], ("train.batch_size", "divisible")),
    ("accum-not-divisible", ["train", "--config", T, "--train.grad_accum", "3"], ("train.grad_accum", "divisible")),
    ("seq-longer-than-context", ["train", "--config", T, "--data.seq_len", "100000"],
     ("data.seq_len", "--model.max_seq_len")),
    ("kv-heads-not-dividing", ["train", "--config", T, "--model.n_kv_heads", "3"], ("model.n_kv_heads", "divide")),
    ("bad-size", ["train", "--config", T, "--model.size", "huge"], ("model.size", "not one of")),
    ("bad-corpus", ["train", "--config", T, "--data.corpus", "web"],
     ("data.corpus", "not one of", "--data.corpus path --data.path FILE_OR_FOLDER")),
    ("corpus-is-a-file", ["train", "--config", T, "--data.corpus", "mytext.txt"],
     ("not one of", "--data.corpus path --data.path mytext.txt")),
    ("bad-tokenizer", ["train", "--config", T, "--data.tokenizer", "sentencepiece"], ("data.tokenizer", "bpe")),
    ("bad-ood", ["train", "--config", T, "--data.ood", "everything"], ("data.ood", "wikipedia")),
    ("small-bpe-vocab", ["train", "--config", T, "--data.vocab_size", "100"], ("data.vocab_size", ">= 300")),
    ("resnet-on-text", ["train", "--config", T, "--model.arch", "resnet18"], "data.kind = 'images'"),
    ("llama-on-images", ["train", "--config", T, "--data.kind", "images"], "data.kind = 'text'"),
    ("bad-image-set", ["train", "--config", T, "--model.arch", "resnet18", "--data.kind", "images",
                       "--data.image_set", "imagenet"], ("data.image_set", "not one of")),
    ("cifar-without-dir", ["train", "--config", T, "--model.arch", "resnet18", "--data.kind", "images",
                           "--data.image_set", "cifar10"], "--data.image_dir"),
    ("path-corpus-without-path", ["train", "--config", T, "--data.corpus", "path"], "--data.path"),
    ("init-from-on-resnet", ["train", "--config", T, "--model.arch", "resnet18", "--data.kind", "images",
                             "--model.init_from", "x"], "model.init_from"),
    ("explicit-without-mask", ["train", "--config", T, "--parallel.mode", "sdp", "--parallel.workers", "2",
                               "--sdp.assignment", "explicit"], "--sdp.mask_file"),
    ("mask-without-explicit", ["train", "--config", T, "--parallel.mode", "sdp", "--parallel.workers", "2",
                               "--sdp.mask_file", "m.txt"], "--sdp.assignment explicit"),
    ("bad-sdp-level", ["train", "--config", T, "--parallel.mode", "sdp", "--parallel.workers", "2",
                       "--sdp.level", "layer"], "sdp.level"),
    ("bad-pipeline-codec", ["train", "--config", T, "--parallel.mode", "pipeline", "--parallel.workers", "2",
                            "--pipeline.codec", "zip"], "pipeline.codec"),
    ("sdp-flag-in-ddp", ["train", "--config", T, "--parallel.mode", "ddp", "--parallel.workers", "2",
                         "--sdp.keep", "0.3"], ("--sdp.keep", "parallel.mode = 'ddp'", "parallel.mode sdp")),
    ("pipeline-flag-in-sdp", ["train", "--config", T, "--parallel.mode", "sdp", "--parallel.workers", "2",
                              "--pipeline.rvq.levels", "2"], ("--pipeline.rvq.levels", "[pipeline]")),
    ("sdp-flag-in-pipeline-ddp", ["train", "--config", T, "--parallel.mode", "pipeline", "--parallel.workers", "2",
                                  "--sdp.level", "neuron"], ("--sdp.level", "--pipeline.dp sdp")),
    ("sdp-keep-in-hybrid", ["train", "--config", T, "--parallel.mode", "pipeline", "--parallel.workers", "4",
                            "--pipeline.dp", "sdp", "--sdp.keep", "0.5"],
     ("--sdp.keep", "reads only sdp.assignment", "--pipeline.sdp_keep")),
    ("eval-without-run", ["eval"], ("--run", "required")),
    ("eval-run-without-value", ["eval", "--run"], ("--run", "expected one argument")),
    ("export-one-path", ["export", "--hf", "only"], ("--hf", "expected 2 arguments")),
    ("export-extra-argument", ["export", "--hf", "a", "b", "c"], ("unexpected arguments c", "usage")),
    ("plan-unknown-flag", ["plan", "--config", T, "--bogus"], "unexpected argument '--bogus'"),
    ("plan-float-workers", ["plan", "--config", T, "--parallel.workers", "1e6"], ("parallel.workers", "expected int")),
    ("bench-unknown-which", ["bench", "nope", "--out", "x"], ("invalid choice", "sdp")),
    ("bench-without-out", ["bench", "sdp"], ("--out", "required")),
    ("bench-readme-with-out", ["bench", "readme", "--out", "x"], ("readme", "no --out")),
    ("bench-check-not-readme", ["bench", "sdp", "--out", "x", "--check"], ("--check", "readme")),
    ("bench-negative-rounds", ["bench", "sdp", "--out", "x", "--timing-rounds", "-1"], "--timing-rounds"),
    ("bench-bad-seeds", ["bench", "sdp", "--out", "x", "--seeds", "a,b"], "--seeds"),
    ("unknown-command", ["fly"], ("invalid choice", "train")),
]


@pytest.mark.parametrize("name, argv, match", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_command_line(name, argv, match, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a run without --out would pick a folder under ./runs: it must not appear
    argv = argv + (["--out", str(tmp_path / "run")] if argv[0] == "train" and "--out" not in argv else [])
    expect_exit_2(argv, tmp_path, capsys, match)


@pytest.mark.parametrize("overrides", [
    ["--parallel.mode", "sdp", "--sdp.keep", "0.3"],
    ["--parallel.mode", "pipeline", "--pipeline.stages", "2", "--pipeline.rvq.levels", "2"],
    ["--parallel.mode", "pipeline", "--pipeline.dp", "sdp", "--sdp.assignment", "random", "--sdp.check_every", "5",
     "--sdp.min_holders", "2", "--pipeline.sdp_keep", "0.5"],
    ["--parallel.mode", "single", "--train.steps", "3"],
])
def test_mode_settings_the_run_reads_pass(overrides):
    """The refusal above is for settings the mode ignores only; a config file's sections are never checked."""
    from slimpar.config import load_config
    from slimpar.train.validate.checks import check_overrides_read

    check_overrides_read(load_config(T, overrides), overrides)
    check_overrides_read(load_config(T, ["--sdp.keep", "0.3", "--pipeline.stages", "2"]), [])  # the file's sections


def test_out_is_a_file(tmp_path, capsys):
    out = write(tmp_path / "run", "not a folder")
    expect_exit_2(["train", "--config", T, "--out", str(out)], tmp_path, capsys, ("--out", "not a folder"))


# ---------------------------------------------------------------- issue 22: values that overflow or allocate
# without bound, a backend the machine lacks, folders that cannot be written, counts beyond the corpus

LIMIT_CASES: list[tuple[str, list[str], str | tuple[str, ...]]] = [
    ("huge-lr", ["--train.lr", "1e30"], ("train.lr", "(0, 1e+06]")),
    ("huge-batch", ["--train.batch_size", "1000000000000"], ("needs at least", "--train.batch_size")),
    ("huge-vocab", ["--model.vocab_size", "1000000000000"], ("needs at least", "--model.vocab_size")),
    ("huge-seq-and-batch", ["--data.seq_len", "64", "--train.batch_size", "4000000000"], "needs at least"),
    ("nccl-on-cpu", ["--parallel.backend", "nccl", "--parallel.mode", "ddp", "--parallel.workers", "2"],
     ("nccl", "--parallel.device cuda")),
    ("heldout-beyond-corpus", ["--data.heldout_works", "50"], ("data.heldout_works", "[0, 41]")),
    ("million-workers", ["--parallel.mode", "sdp", "--parallel.workers", "1000000"], ("parallel.workers", "4096")),
    ("empty-out", ["--out", ""], ("--out", "empty")),
    ("blank-out", ["--out", "  "], ("--out", "empty")),
]


@pytest.mark.parametrize("name, extra, match", LIMIT_CASES, ids=[c[0] for c in LIMIT_CASES])
def test_values_beyond_what_can_run(name, extra, match, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --out '' used to write into ./runs
    out = [] if "--out" in extra else ["--out", str(tmp_path / "run")]
    expect_exit_2(["train", "--config", T, *out, *extra], tmp_path, capsys, match)


def test_plan_with_a_million_workers_is_refused_at_once(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # it used to plan for minutes
    expect_exit_2(["plan", "--config", T, "--parallel.mode", "sdp", "--parallel.workers", "1000000"], tmp_path,
                  capsys, ("parallel.workers", "4096"))


def test_token_id_beyond_any_vocabulary(tmp_path, capsys):
    ids = np.arange(5000, dtype=np.int64)
    ids[7] = 1 << 40  # the model would need 2**40 embedding rows
    path = write(tmp_path / "tokens.npy", _npy(ids))
    expect_exit_2(["train", "--config", T, "--out", str(tmp_path / "run"), "--data.corpus", "path", "--data.path",
                   str(path), "--data.ood", "none"], tmp_path, capsys, ("token id 1099511627776", "below"))


@pytest.mark.parametrize("field", ["--out", "--data.cache_dir"])
def test_folder_under_a_regular_file(field, tmp_path, capsys):
    under = write(tmp_path / "a-file", "x") / "sub"
    out = [] if field == "--out" else ["--out", str(tmp_path / "run")]
    expect_exit_2(["train", "--config", T, *out, field, str(under)], tmp_path, capsys, ("a-file", "is a file"))


@pytest.fixture
def read_only_folder(tmp_path):
    """A read-only tmpfs (as a read-only mount refuses root too, unlike chmod): the tests run as root here."""
    import subprocess

    folder = tmp_path / "ro"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], check=True)
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("field", ["--out", "--data.cache_dir"])
def test_read_only_folder(field, read_only_folder, tmp_path, capsys):
    target = str(read_only_folder / "run")
    out = [] if field == "--out" else ["--out", str(tmp_path / "run")]
    expect_exit_2(["train", "--config", T, *out, field, target], tmp_path, capsys, ("cannot be written", "Read-only"))


# ---------------------------------------------------------------- SDP plans: --sdp.assignment explicit

def _npy(array) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()


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
    ("npy-1d", "mask.npy", _npy(np.array([1, 0, 1, 0])), ("SDP plan", "0/1")),
    ("npy-floats", "mask.npy", _npy(np.full((2, 4), 0.5)), ("SDP plan", "0/1")),
    ("npy-object-pickle", "mask.npy", _npy(np.array([[1, 0], "x"], dtype=object)), ("SDP plan", "mask.npy")),
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
        "npy-2d": lambda: write(d / "tok.npy", _npy(np.zeros((40, 40), dtype=np.int64))),
        "npy-floats": lambda: write(d / "tok.npy", _npy(np.zeros(1000, dtype=np.float32))),
        "npy-object-pickle": lambda: write(d / "tok.npy", _npy(np.array([1, "x"] * 200, dtype=object))),
        "npy-too-short": lambda: write(d / "tok.npy", _npy(np.arange(10, dtype=np.int32))),
        "npy-negative-ids": lambda: write(d / "tok.npy", _npy(np.arange(-5, 995, dtype=np.int32))),
        "npy-truncated": lambda: write(d / "tok.npy", _npy(np.arange(1000, dtype=np.int64))[:-3000]),
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


# ---------------------------------------------------------------- run folders: eval and export

def _copy_run(tiny_run: Path, dest: Path) -> Path:
    shutil.copytree(tiny_run, dest)
    for name in ("eval.json",):
        (dest / name).unlink(missing_ok=True)
    return dest


def _flip(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


RUN_DEFECTS: dict[str, Callable[[Path], None]] = {
    "no-manifest": lambda r: (r / "manifest.json").unlink(),
    "truncated-export": lambda r: _truncate(r / "model.safetensors"),
    "flipped-byte-in-export": lambda r: _flip(r / "model.safetensors"),
    "flipped-byte-in-header": lambda r: _flip(r / "model.safetensors", at=20),
    "export-missing": lambda r: (r / "model.safetensors").unlink(),
    "manifest-garbage": lambda r: write(r / "manifest.json", "{not json"),
    "manifest-without-export": lambda r: write(r / "manifest.json", json.dumps({"format": 1, "files": {}})),
    "manifest-escapes-folder": lambda r: write(r / "manifest.json", json.dumps(
        {"format": 1, "files": {"../x": {"sha256": "0" * 64, "size": 1}}})),
    "config-missing": lambda r: (r / "config.toml").unlink(),
    "config-not-toml": lambda r: write(r / "config.toml", "[model\n"),
    "config-unknown-key": lambda r: write(r / "config.toml", (r / "config.toml").read_text() + "\n[extra]\nx = 1\n"),
}
RUN_MATCH = {
    "no-manifest": ("no manifest.json", "python -m slimpar.train.checkpoint.manifest write"),
    "truncated-export": ("model.safetensors", "truncated"),
    "flipped-byte-in-export": ("model.safetensors", "sha256"),
    "flipped-byte-in-header": ("model.safetensors", "sha256"),
    "export-missing": ("model.safetensors", "not found"),
    "manifest-garbage": ("not a valid slimpar manifest",),
    "manifest-without-export": ("does not list model.safetensors",),
    "manifest-escapes-folder": ("outside its folder",),
    "config-missing": ("config.toml", "not found"),
    "config-not-toml": ("config.toml", "not valid TOML"),
    "config-unknown-key": ("unknown config key 'extra'",),
}


@pytest.mark.parametrize("defect", list(RUN_DEFECTS))
def test_eval_refuses_a_bad_run_folder(defect, tiny_run, tmp_path, capsys):
    run = _copy_run(tiny_run, tmp_path / "run")
    RUN_DEFECTS[defect](run)
    expect_exit_2(["eval", "--run", str(run)], tmp_path, capsys, RUN_MATCH[defect])


@pytest.mark.parametrize("defect", [d for d in RUN_DEFECTS if d != "config-unknown-key"])
def test_export_refuses_a_bad_run_folder(defect, tiny_run, tmp_path, capsys):
    run = _copy_run(tiny_run, tmp_path / "run")
    RUN_DEFECTS[defect](run)
    expect_exit_2(["export", "--hf", str(run), str(tmp_path / "hf")], tmp_path, capsys, RUN_MATCH[defect])


EVAL_PATH_CASES: list[tuple[str, Callable[[Path], str], str | tuple[str, ...]]] = [
    ("missing-folder", lambda d: str(d / "nope"), ("not found", "slimpar train")),
    ("empty-folder", lambda d: (d / "empty").mkdir() or str(d / "empty"), ("config.toml", "not found")),
    ("a-file", lambda d: str(write(d / "file", "x")), "not found"),
    ("only-a-config", lambda d: str(write(d / "partial" / "config.toml", "[model]\n").parent),
     ("model.safetensors", "checkpoint.export = true")),
]


@pytest.mark.parametrize("name, run, match", EVAL_PATH_CASES, ids=[c[0] for c in EVAL_PATH_CASES])
def test_eval_and_export_refuse_a_missing_or_partial_folder(name, run, match, tmp_path, capsys):
    path = run(tmp_path)
    expect_exit_2(["eval", "--run", path], tmp_path, capsys, match)
    expect_exit_2(["export", "--hf", path, str(tmp_path / "hf")], tmp_path, capsys, match)


def test_eval_refuses_a_model_that_does_not_fit_the_weights(tiny_run, tmp_path, capsys):
    run = _copy_run(tiny_run, tmp_path / "run")
    expect_exit_2(["eval", "--run", str(run), "--model.size", "small"], tmp_path, capsys,
                  ("does not fit the model", "drop the --model.* overrides"))


def test_eval_refuses_a_bad_override(tiny_run, tmp_path, capsys):
    run = _copy_run(tiny_run, tmp_path / "run")
    expect_exit_2(["eval", "--run", str(run), "--train.stepz", "3"], tmp_path, capsys, "unknown config key")


def test_export_refuses_an_out_that_is_a_file_or_not_empty(tiny_run, tmp_path, capsys):
    run = _copy_run(tiny_run, tmp_path / "run")
    out = write(tmp_path / "hf", "a file")
    expect_exit_2(["export", "--hf", str(run), str(out)], tmp_path, capsys, ("not empty", "new folder"))
    out.unlink()
    write(tmp_path / "hf" / "keep.txt", "mine")
    expect_exit_2(["export", "--hf", str(run), str(tmp_path / "hf")], tmp_path, capsys, "not empty")


def test_export_refuses_a_non_llama_run(tiny_run, tmp_path, capsys):
    from slimpar.train.checkpoint.manifest import write_manifest

    run = _copy_run(tiny_run, tmp_path / "run")
    text = (run / "config.toml").read_text().replace('arch = "llama"', 'arch = "resnet18"')
    write(run / "config.toml", text)
    write_manifest(run, ["model.safetensors"])
    expect_exit_2(["export", "--hf", str(run), str(tmp_path / "hf")], tmp_path, capsys, "only LLaMA runs")


# ---------------------------------------------------------------- checkpoints: train --resume

class _Crafted:
    """A pickle that would run a shell command when loaded (os.system through __reduce__)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _ckpt(run: Path) -> Path:
    (path,) = sorted((run / "checkpoints").iterdir())
    return path


def _shard(run: Path) -> Path:
    return sorted(_ckpt(run).glob("*.distcp"))[0]


CKPT_DEFECTS: dict[str, Callable[[Path], None]] = {
    "truncated-shard": lambda r: _truncate(_shard(r)),
    "empty-shard": lambda r: _truncate(_shard(r), 0.0),
    "flipped-byte-in-shard": lambda r: _flip(_shard(r)),
    "flipped-first-byte-of-shard": lambda r: _flip(_shard(r), at=0),
    "shard-missing": lambda r: _shard(r).unlink(),
    "trainer-json-step-999": lambda r: write(_ckpt(r) / "trainer.json", json.dumps({"step": 999})),
    "trainer-json-garbage": lambda r: write(_ckpt(r) / "trainer.json", "{step"),
    "metadata-missing": lambda r: (_ckpt(r) / ".metadata").unlink(),
    "metadata-truncated": lambda r: _truncate(_ckpt(r) / ".metadata"),
    "metadata-crafted-pickle": lambda r: write(_ckpt(r) / ".metadata", pickle.dumps(_Crafted(r.parent / "pwned"))),
    "manifest-missing": lambda r: (_ckpt(r) / "manifest.json").unlink(),
    "manifest-garbage": lambda r: write(_ckpt(r) / "manifest.json", "[]"),
    "unlisted-file": lambda r: write(_ckpt(r) / "__9_0.distcp", b"extra"),
    "renamed-folder": lambda r: _ckpt(r).rename(_ckpt(r).with_name("step_000002")),
}
CKPT_MATCH = {
    "truncated-shard": ("truncated", "use another checkpoint"),
    "empty-shard": ("truncated", "use another checkpoint"),
    "flipped-byte-in-shard": ("sha256", "use another checkpoint"),
    "flipped-first-byte-of-shard": ("sha256", "use another checkpoint"),
    "shard-missing": ("is missing", "use another checkpoint"),
    "trainer-json-step-999": ("trainer.json", "use another checkpoint"),
    "trainer-json-garbage": ("trainer.json", "use another checkpoint"),
    "metadata-missing": (".metadata is missing",),
    "metadata-truncated": (".metadata", "truncated"),
    "metadata-crafted-pickle": (".metadata", "manifest"),
    "manifest-missing": ("no manifest.json", "manifest write"),
    "manifest-garbage": ("not a valid slimpar manifest",),
    "unlisted-file": ("does not list", "__9_0.distcp"),
    "renamed-folder": ("says step 3", "step_000002"),
}


@pytest.mark.parametrize("defect", list(CKPT_DEFECTS))
def test_resume_refuses_a_bad_checkpoint(defect, tiny_run, tmp_path, capsys):
    run = _copy_run(tiny_run, tmp_path / "run")
    CKPT_DEFECTS[defect](run)
    argv = ["train", "--config", T, "--out", str(run), *TINY_RUN_ARGS, "--resume"]
    expect_exit_2(argv, tmp_path, capsys, CKPT_MATCH[defect])
    assert not (tmp_path / "pwned").exists()


def test_resume_of_the_untouched_copy_verifies(tiny_run, tmp_path):
    """The baseline of the checkpoint cases: an untouched copy passes the launcher's check."""
    from slimpar.train.checkpoint.preflight import check_resume

    run = _copy_run(tiny_run, tmp_path / "run")
    assert check_resume(run).name == "step_000003"


# ---------------------------------------------------------------- issue 40: config messages, a dangling --out


def test_every_unknown_name_is_reported_at_once(tmp_path, capsys):
    toml = write(tmp_path / "bad.toml", "[train]\nstpes = 20\n[optimiser]\nlr = 1\n")
    expect_exit_2(["train", "--config", str(toml), "--out", str(tmp_path / "run")], tmp_path, capsys,
                  ("unknown config key 'train.stpes' (did you mean 'train.steps'?",
                   "; unknown config key 'optimiser' (a section; known keys in this section: checkpoint"))


def test_a_dangling_out_symlink(tmp_path, capsys):
    watched = tmp_path / "watched"  # where the link points: nothing may appear there
    watched.mkdir()
    (tmp_path / "run").symlink_to(watched / "gone" / "run")  # it used to be "internal error: FileExistsError"
    expect_exit_2(["train", "--config", T, "--out", str(tmp_path / "run")], watched, capsys,
                  ("--out", "is a symbolic link to", "which does not exist"))


def test_a_models_own_values_spelled_out_are_the_same_model(tiny_run, tmp_path, capsys):
    """Model shapes are compared by their resolved values: --model.n_layers 4 on tiny is tiny (issue 40); 3 is
    another model."""
    run = _copy_run(tiny_run, tmp_path / "run")
    spelled = ["--model.n_layers", "4", "--model.max_seq_len", "256", "--model.n_kv_heads", "2"]
    assert main(["train", "--config", T, *TINY_RUN_ARGS, "--out", str(run), *spelled]) == 0
    assert "nothing to train" in capsys.readouterr().out  # it resumed the finished run
    expect_exit_2(["train", "--config", T, *TINY_RUN_ARGS, "--out", str(run), "--model.n_layers", "3"], tmp_path,
                  capsys, ("holds another model", "n_layers: checkpoint 4, this run 3"))


def test_case_count():
    """At least 100 malformed inputs outside the numeric ranges of test_validate_numbers.py."""
    counts = {
        "config files": len(TOML_CASES) + len(CONFIG_PATH_CASES),
        "command line": len(CLI_CASES) + 1,
        "plans": len(MASK_CASES),
        "data files": len(DATA_CASES) + len(IMAGE_CASES),
        "run folders": len(RUN_DEFECTS) + len(RUN_DEFECTS) - 1 + 2 * len(EVAL_PATH_CASES) + 1 + 2 + 1,
        "checkpoints": len(CKPT_DEFECTS),
        "limits, backends, folders (issue 22)": len(LIMIT_CASES) + 1 + 1 + 2 + 2 + 1,
        "config messages, dangling --out (issue 40)": 3,
    }
    assert sum(counts.values()) >= 100, counts
