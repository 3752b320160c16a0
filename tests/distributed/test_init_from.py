"""``--model.init_from``: a run starts from a Hugging Face LLaMA folder with its exact weights."""

import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig as HFConfig
from transformers import LlamaForCausalLM

from slimpar.train.build import build_model
from slimpar.train.validate.checks import load_run_config
from tests.helpers import ROOT, TINY, losses, run_train


def _hf_folder(path, vocab: int):
    torch.manual_seed(3)
    hf = LlamaForCausalLM(HFConfig(vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=False)).eval()
    hf.save_pretrained(path)
    return hf


def test_model_starts_from_the_folder_with_equal_logits(tmp_path):
    hf = _hf_folder(tmp_path / "hf", vocab=5000)
    cfg = load_run_config(TINY, ["--model.init_from", str(tmp_path / "hf")])
    model = build_model(cfg).eval()
    x = torch.randint(0, 5000, (2, 21))
    with torch.no_grad():
        assert (model(x) - hf(x).logits).abs().max().item() <= 1e-4
    assert model.cfg.n_layers == 2  # the folder's shape, not model.size = tiny's 4 blocks


@pytest.mark.slow  # 60 s on 2 cores; the default suite keeps the folder's model and logits (the test above)
def test_training_from_a_folder_and_its_errors(tmp_path):
    _hf_folder(tmp_path / "hf", vocab=5000)
    out = tmp_path / "run"
    run_train(out, "--model.init_from", str(tmp_path / "hf"), "--train.steps", "2", "--eval.batches", "1",
              "--data.ood", "none", "--checkpoint.export", "false")
    assert len(losses(out)) == 2
    assert (out / "init_from.json").is_file()  # the sha256 of the files the run started from
    with open(tmp_path / "hf" / "model.safetensors", "r+b") as f:  # the folder changes after the first start
        f.seek(-1, 2)
        f.write(b"\x01")
    proc = subprocess.run([sys.executable, "-m", "slimpar", "train", "--config", str(TINY), "--out", str(out),
                           "--model.init_from", str(tmp_path / "hf"), "--train.steps", "2", "--eval.batches", "1",
                           "--data.ood", "none", "--checkpoint.export", "false"],  # the same run, re-run
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "model.safetensors has changed" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    _hf_folder(tmp_path / "small", vocab=300)  # fewer embeddings than the tiny config's 512-token tokenizer
    for folder, message in [(tmp_path / "nowhere", "config.json"), (tmp_path / "small", "embeddings")]:
        proc = subprocess.run([sys.executable, "-m", "slimpar", "train", "--config", str(TINY), "--out",
                               str(tmp_path / "bad"), "--model.init_from", str(folder)], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and not (tmp_path / "bad").exists()
