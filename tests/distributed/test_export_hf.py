"""``slimpar export --hf``: transformers loads the run (model and tokenizer) without slimpar, same logits."""

import json
import subprocess
import sys

import tomllib
import torch

from slimpar.data.text import build_text_data
from slimpar.models.llama import Llama
from slimpar.train.build import llama_config
from slimpar.train.checkpoint.export import load_safetensors
from slimpar.train.validate.checks import load_run_config
from tests.helpers import ROOT

# slimpar is made unimportable in the loading process: the export must stand on its own
LOAD = """
import sys, json, torch
sys.modules["slimpar"] = None
from transformers import AutoTokenizer, LlamaForCausalLM
out = sys.argv[1]
model = LlamaForCausalLM.from_pretrained(out).eval()
tok = AutoTokenizer.from_pretrained(out)
ids = tok("To be, or not to be, that is the question:")["input_ids"]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits
torch.save({"ids": ids, "logits": logits}, out + "/check.pt")
"""


def test_run_folder_keeps_tokenizer_and_real_vocab(tiny_run):
    config = tomllib.loads((tiny_run / "config.toml").read_text())
    state = load_safetensors(tiny_run / "model.safetensors")
    assert config["model"]["vocab_size"] == state["tok_embeddings.weight"].shape[0] > 0
    assert json.loads((tiny_run / "tokenizer.json").read_text())["model"]["type"] == "BPE"


def test_export_loads_in_transformers_with_equal_logits(tiny_run, tmp_path):
    out = tmp_path / "hf"
    proc = subprocess.run([sys.executable, "-m", "slimpar", "export", "--hf", str(tiny_run), str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-c", LOAD, str(out)], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = torch.load(out / "check.pt", weights_only=True)
    cfg = load_run_config(tiny_run / "config.toml")
    ours = Llama(llama_config(cfg)).eval()
    ours.load_state_dict(load_safetensors(tiny_run / "model.safetensors"))
    text = "To be, or not to be, that is the question:"
    assert check["ids"] == build_text_data(cfg.data, seed=0).tokenizer.encode(text)  # same tokenizer
    with torch.no_grad():
        assert (ours(torch.tensor([check["ids"]])) - check["logits"]).abs().max().item() <= 1e-4


def test_export_refuses_a_non_empty_folder(tiny_run, tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    proc = subprocess.run([sys.executable, "-m", "slimpar", "export", "--hf", str(tiny_run), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "not empty" in proc.stderr and "Traceback" not in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
