"""What the bad-input tests share (tests/unit/test_bad_input*.py): the tiny config, a digest of a folder tree, a
CLI run that must exit 2 having written nothing, and the ways a copied run folder is damaged."""

from __future__ import annotations

import hashlib
import io
import shutil
from pathlib import Path

import numpy as np

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


def copy_run(tiny_run: Path, dest: Path) -> Path:
    shutil.copytree(tiny_run, dest)
    for name in ("eval.json",):
        (dest / name).unlink(missing_ok=True)
    return dest


def flip(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def npy(array) -> bytes:
    """``array`` as the bytes of a .npy file."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()
