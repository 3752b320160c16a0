"""Malformed inputs (issue 11, item 8): each gives exit 2, one message naming the problem (and the fix),
no traceback, and nothing written (the folder tree is compared before and after).

Every case runs in-process through ``slimpar.cli.main`` (which returns 2 on a ConfigError; argparse's own
usage errors exit 2 through SystemExit). Numeric ranges (NaN, inf, negative sizes...) are in
tests/unit/test_validate_numbers.py and not repeated here; a few end-to-end subprocess cases are in
tests/distributed/test_bad_input_cli.py. Categories: config files, command line and limits here;
SDP plans and data files in test_bad_input_files.py; run folders (eval, export) and checkpoints
(``train --resume``) in test_bad_input_runs.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from slimpar.cli import main
from tests.bad_input import TINY_RUN_ARGS, T, copy_run, expect_exit_2, npy, write
from tests.unit.test_bad_input_files import DATA_CASES, IMAGE_CASES, MASK_CASES
from tests.unit.test_bad_input_runs import CKPT_DEFECTS, EVAL_PATH_CASES, RUN_DEFECTS

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
    path = write(tmp_path / "tokens.npy", npy(ids))
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
    run = copy_run(tiny_run, tmp_path / "run")
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
