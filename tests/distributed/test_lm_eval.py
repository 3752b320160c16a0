"""``slimpar eval --run RUN --lm-eval slimpar``: lm-evaluation-harness on a tiny run's export, end to end,
with the bits per byte cross-checked by an independent computation on the same documents."""

import json
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from slimpar.data.eval_tasks import nextline_items, shakespeare_documents
from slimpar.data.text import build_text_data
from slimpar.models.llama import Llama
from slimpar.train.build import llama_config
from slimpar.train.checkpoint.export import load_safetensors
from slimpar.train.validate.checks import load_run_config
from tests.helpers import ROOT

LIMIT = 6


@pytest.fixture(scope="module")
def evaluated(tiny_run):
    proc = subprocess.run([sys.executable, "-m", "slimpar", "eval", "--run", str(tiny_run), "--lm-eval", "slimpar",
                           "--limit", str(LIMIT)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((tiny_run / "lm_eval.json").read_text()), proc.stdout


def _bits_per_byte(model: Llama, tokenizer, docs: list[str]) -> float:
    """Each document after an end-of-text token, cut into windows of the model's context (disjoint targets)."""
    nll = nbytes = 0.0
    ctx = model.cfg.max_seq_len
    for text in docs:
        ids = [tokenizer.eot_id, *tokenizer.encode(text)]
        for start in range(0, len(ids) - 1, ctx):
            x = torch.tensor([ids[start:start + ctx]])
            y = torch.tensor([ids[start + 1:start + ctx + 1]])
            with torch.no_grad():
                logits = model(x)[:, : y.shape[1]]
            nll += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum"))
        nbytes += len(text.encode("utf-8"))
    return nll / math.log(2) / nbytes


def test_local_tasks_report_their_metrics(evaluated):
    out, stdout = evaluated
    tasks = out["tasks"]
    assert set(tasks) == {"slimpar_shakespeare_bpb", "slimpar_wikipedia_bpb", "slimpar_shakespeare_nextline"}
    for name in ("slimpar_shakespeare_bpb", "slimpar_wikipedia_bpb"):
        assert 0 < tasks[name]["bits_per_byte"] < 10
    assert 0 <= tasks["slimpar_shakespeare_nextline"]["acc"] <= 1
    assert out["limit"] == LIMIT and "val_loss" in out["slimpar_eval"]
    assert "slimpar_shakespeare_bpb" in stdout and "slimpar eval (same run)" in stdout


def test_bits_per_byte_agrees_with_an_independent_count(evaluated, tiny_run):
    out, _ = evaluated
    cfg = load_run_config(tiny_run / "config.toml")
    model = Llama(llama_config(cfg)).eval()
    model.load_state_dict(load_safetensors(tiny_run / "model.safetensors"))
    tokenizer = build_text_data(cfg.data, seed=0).tokenizer
    docs = [d["text"] for d in shakespeare_documents(cfg.data.heldout_works)[:LIMIT]]
    ours = _bits_per_byte(model, tokenizer, docs)
    # lm-eval's rolling windows overlap by one token where ours do not: equal to well under 1%
    assert out["tasks"]["slimpar_shakespeare_bpb"]["bits_per_byte"] == pytest.approx(ours, rel=0.01)


def test_next_line_items_are_well_formed():
    items = nextline_items(4, n=50)
    assert len(items) == 50 and all(len(i["choices"]) == 4 and 0 <= i["label"] < 4 for i in items)
    assert len({i["label"] for i in items}) == 4  # the true line is not always in the same place
    assert all(i["choices"][i["label"]] not in i["context"] for i in items)
