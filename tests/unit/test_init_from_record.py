"""``--model.init_from`` checked against the sha256 recorded at the run's first start (issue 22, item 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from slimpar.cli import main
from slimpar.config import Config, ConfigError
from slimpar.models.hf_llama import save_hf
from slimpar.models.llama import Llama, LlamaConfig
from slimpar.train.checkpoint.init_from import INIT_FROM_RECORD, check_init_from, record_init_from
from slimpar.train.launch.launcher import prepare_out_dir
from tests.helpers import TINY, single_process_context


def _hf_folder(path: Path) -> Path:
    torch.manual_seed(0)
    lc = LlamaConfig.tiny(vocab_size=512)
    save_hf(Llama(lc).state_dict(), lc, path)
    return path


def _cfg(folder: Path, resume: bool = True) -> Config:
    cfg = Config()
    cfg.model.init_from = str(folder)
    cfg.checkpoint.resume = resume
    return cfg


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_first_start_records_and_later_starts_check(tmp_path):
    folder, out = _hf_folder(tmp_path / "hf"), tmp_path / "run"
    prepare_out_dir(_cfg(folder), out)
    record = json.loads((out / INIT_FROM_RECORD).read_text())
    assert set(record["files"]) == {"config.json", "model.safetensors"}
    assert record["folder"] == str(folder.resolve())
    check_init_from(_cfg(folder), out)
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    _flip(weights)  # same size, other bytes
    with pytest.raises(ConfigError, match=r"model.safetensors has changed: its sha256.*--fresh"):
        check_init_from(_cfg(folder), out)
    weights.write_bytes(good[:-8])
    with pytest.raises(ConfigError, match=rf"has changed: {len(good) - 8} bytes, {len(good)} at the first start"):
        check_init_from(_cfg(folder), out)
    weights.unlink()
    with pytest.raises(ConfigError, match="model.safetensors is missing"):
        check_init_from(_cfg(folder), out)
    weights.write_bytes(good)
    check_init_from(_cfg(folder), out)
    copy = tmp_path / "moved"  # the same files elsewhere: what matters is what they hold
    copy.mkdir()
    for p in folder.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    check_init_from(_cfg(copy), out)
    check_init_from(Config(), out)  # a run without init_from: nothing to check


def test_resume_keeps_the_first_record_and_fresh_makes_a_new_one(tmp_path):
    folder, out = _hf_folder(tmp_path / "hf"), tmp_path / "run"
    prepare_out_dir(_cfg(folder), out)
    first = (out / INIT_FROM_RECORD).read_text()
    _flip(folder / "model.safetensors")
    prepare_out_dir(_cfg(folder), out)  # a resume: the record still describes the first start
    assert (out / INIT_FROM_RECORD).read_text() == first
    with pytest.raises(ConfigError, match="has changed"):
        check_init_from(_cfg(folder), out)
    prepare_out_dir(_cfg(folder, resume=False), out)  # --fresh: start over from the new files
    assert (out / INIT_FROM_RECORD).read_text() != first
    check_init_from(_cfg(folder), out)
    assert record_init_from(Config(), out) is None


def test_a_malformed_record_is_a_clear_error(tmp_path):
    folder, out = _hf_folder(tmp_path / "hf"), tmp_path / "run"
    out.mkdir()
    (out / INIT_FROM_RECORD).write_text('{"files": {"../x": {}}}')
    with pytest.raises(ConfigError, match="not a valid model.init_from record"):
        check_init_from(_cfg(folder), out)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_cli_refuses_a_changed_folder_before_anything_is_written(tmp_path, capsys):
    folder, out = _hf_folder(tmp_path / "hf"), tmp_path / "run"
    prepare_out_dir(_cfg(folder), out)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, rms_norm_eps=1e-3)))  # still a valid config
    before = _tree(tmp_path)
    argv = ["train", "--config", str(TINY), "--out", str(out), "--model.init_from", str(folder)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("slimpar: error: model.init_from: ") and "config.json has changed" in err
    assert _tree(tmp_path) == before
    (folder / "config.json").write_bytes(b"\xff\xfe{}")  # not UTF-8: a clear error too, before the check
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "is not a LLaMA config" in err and "Traceback" not in err


def test_every_worker_checks_before_it_reads_the_weights(tmp_path, monkeypatch):
    import slimpar.train.trainer as trainer

    folder, out = _hf_folder(tmp_path / "hf"), tmp_path / "run"
    prepare_out_dir(_cfg(folder), out)
    _flip(folder / "model.safetensors")
    monkeypatch.setattr(trainer, "build_data", lambda cfg: None)
    monkeypatch.setattr(trainer, "record_run_files", lambda *a: None)

    def build_model(*a):
        raise AssertionError("the weights were read before the check")

    monkeypatch.setattr(trainer, "build_model", build_model)
    ctx = single_process_context()
    ctx.out_dir = out
    with pytest.raises(ConfigError, match="model.safetensors has changed"):
        trainer.Trainer(_cfg(folder), ctx)._build()
