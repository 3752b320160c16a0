"""Run outputs are readable like any other file: their mode is 0666 less the umask, not safetensors' 0600."""

import os
import stat

import pytest
import torch

from slimpar.models.hf_llama import save_hf
from slimpar.models.llama import Llama, LlamaConfig
from slimpar.train.checkpoint.export import export_safetensors


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_exported_model_respects_the_umask(tmp_path, umask):
    export_safetensors({"w": torch.zeros(3)}, tmp_path / "model.safetensors", {})
    assert _mode(tmp_path / "model.safetensors") == 0o666 & ~umask  # 0644 under umask 022
    assert _mode(tmp_path / "manifest.json") == 0o666 & ~umask


def test_hf_export_respects_the_umask(tmp_path, umask):
    cfg = LlamaConfig.tiny()
    for path in save_hf(Llama(cfg).state_dict(), cfg, tmp_path / "hf"):
        assert _mode(path) == 0o666 & ~umask, path.name
