"""Trusted state (issue 11, item 4): checksum manifests, checkpoints checked before DCP unpickles anything,
CIFAR read without running code, and text that is not valid in its encoding refused."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from torch.distributed.checkpoint.metadata import Metadata

from slimpar.config import ConfigError
from slimpar.data.corpora import user_texts
from slimpar.data.errors import DataUnavailable
from slimpar.data.images import load_cifar, read_cifar_batch
from slimpar.train.checkpoint.dcp import verify_checkpoint
from slimpar.train.checkpoint.manifest import ManifestError, main, verify_manifest, write_manifest


class _Crafted:
    """Runs a shell command when unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_manifest_round_trip_and_refusals(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"\x00" * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("hello")
    write_manifest(tmp_path, extra={"c.json": b"{}"})
    (tmp_path / "c.json").write_bytes(b"{}")
    assert set(verify_manifest(tmp_path)) == {"a.bin", "sub/b.txt", "c.json"}
    (tmp_path / "a.bin").write_bytes(b"\x00" * 99 + b"\x01")  # same size, other bytes
    with pytest.raises(ManifestError, match="a.bin does not match its sha256"):
        verify_manifest(tmp_path)
    (tmp_path / "a.bin").write_bytes(b"\x00" * 50)
    with pytest.raises(ManifestError, match="a.bin has 50 bytes, its manifest says 100"):
        verify_manifest(tmp_path)
    (tmp_path / "a.bin").write_bytes(b"\x00" * 100)
    (tmp_path / "new").write_text("x")
    with pytest.raises(ManifestError, match="does not list \\(new\\)"):
        verify_manifest(tmp_path)
    verify_manifest(tmp_path, complete=False)
    assert issubclass(ManifestError, ConfigError)  # exit 2 from the CLI


def test_manifest_command(tmp_path, capsys):
    (tmp_path / "x").write_text("1")
    assert main(["verify", str(tmp_path)]) == 2 and "no manifest.json" in capsys.readouterr().err
    assert main(["write", str(tmp_path)]) == 0
    assert main(["verify", str(tmp_path)]) == 0


def _fake_checkpoint(root: Path, step: int = 3) -> Path:
    path = root / "checkpoints" / f"step_{step:06d}"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata={}, storage_data={})))
    (path / "__0_0.distcp").write_bytes(os.urandom(256))
    write_manifest(path, extra={"trainer.json": json.dumps({"step": step}).encode()})
    (path / "trainer.json").write_text(json.dumps({"step": step}))
    return path


def test_verify_checkpoint_runs_before_dcp_reads_the_metadata(tmp_path):
    """What load_checkpoint calls inside every worker: a crafted .metadata is refused unread."""
    path = _fake_checkpoint(tmp_path)
    assert verify_checkpoint(path) == 3
    (path / ".metadata").write_bytes(pickle.dumps(_Crafted(tmp_path / "pwned")))
    with pytest.raises(ManifestError, match=r"\.metadata"):
        verify_checkpoint(path)
    assert not (tmp_path / "pwned").exists()


def test_verify_checkpoint_checks_the_step_against_the_folder(tmp_path):
    path = _fake_checkpoint(tmp_path)
    moved = path.rename(path.with_name("step_000004"))
    with pytest.raises(ManifestError, match="says step 3 but the folder is step_000004"):
        verify_checkpoint(moved)


def test_the_launchers_resume_check_hashes_a_checkpoint_once_until_it_changes(tmp_path, monkeypatch):
    """The launcher checks a resume twice (before and after the config loads); the second hashes nothing unless a
    file changed in between, and then it fails as the first would have."""
    from slimpar.train.checkpoint import dcp
    from slimpar.train.checkpoint.preflight import check_resume

    path, calls, real = _fake_checkpoint(tmp_path), [], dcp.verify_checkpoint
    monkeypatch.setattr(dcp, "verify_checkpoint", lambda p: calls.append(p) or real(p))
    assert check_resume(tmp_path) == path and check_resume(tmp_path) == path
    assert len(calls) == 1
    (path / "__0_0.distcp").write_bytes(os.urandom(255))  # rewritten: another size
    with pytest.raises(ManifestError, match="__0_0.distcp has 255 bytes"):
        check_resume(tmp_path)
    assert len(calls) == 2


# ---------------------------------------------------------------- CIFAR without pickle's code execution

def _batch(protocol: int) -> bytes:
    rng = np.random.default_rng(0)
    return pickle.dumps({b"batch_label": b"x", b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
                         b"labels": [1, 2, 3, 4]}, protocol=protocol)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_cifar_batches_of_every_protocol_load(protocol, tmp_path):
    (tmp_path / "b").write_bytes(_batch(protocol))
    batch = read_cifar_batch(tmp_path / "b")
    assert batch[b"data"].shape == (4, 3072) and batch[b"labels"] == [1, 2, 3, 4]


@pytest.mark.parametrize("payload", ["os.system", "object-dtype", "eval"])
def test_cifar_crafted_pickle_is_refused_without_running(payload, tmp_path):
    marker = tmp_path / "pwned"
    if payload == "os.system":
        data = pickle.dumps({b"data": _Crafted(marker), b"labels": []})
    elif payload == "object-dtype":
        data = pickle.dumps({b"data": np.array([_Crafted(marker)], dtype=object), b"labels": []})
    else:
        class Evil:
            def __reduce__(self):
                return (eval, (f"open({str(marker)!r}, 'w')",))
        data = pickle.dumps({b"data": Evil()})
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        (folder / name).write_bytes(data)
    with pytest.raises(DataUnavailable, match="not a CIFAR python batch"):
        load_cifar(str(tmp_path), "cifar10", "train")
    assert not marker.exists()


# ---------------------------------------------------------------- text encodings

def test_text_must_decode_in_its_encoding(tmp_path):
    f = tmp_path / "fr.txt"
    f.write_bytes("Caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1"))
    with pytest.raises(DataUnavailable, match=r"not valid utf-8 text \(byte 3.*--data.encoding latin-1"):
        user_texts(f)
    assert user_texts(f, "latin-1") == ["Café crème brûlée\n"]
    (tmp_path / "w.txt").write_bytes("hello\n".encode("utf-16-le"))
    with pytest.raises(DataUnavailable, match="NUL"):
        user_texts(tmp_path / "w.txt")
    assert user_texts(tmp_path / "w.txt", "utf-16-le") == ["hello\n"]
