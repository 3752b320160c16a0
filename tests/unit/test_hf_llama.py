"""HF format in and out: slimpar's Llama against transformers' LlamaForCausalLM on the same files."""

import json

import pytest
import torch
from transformers import LlamaConfig as HFConfig
from transformers import LlamaForCausalLM

from slimpar.models.hf_llama import HFFormatError, load_hf, save_hf
from slimpar.models.llama import Llama, LlamaConfig


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    for p in model.parameters():  # move norms off 1.0 so they are exercised
        if p.dim() == 1:
            p.data.uniform_(0.5, 1.5)
    return model.eval()


@pytest.mark.parametrize("tie", [True, False])
def test_export_loads_in_transformers_with_equal_logits(tmp_path, tie):
    torch.manual_seed(0)
    model = _perturbed(Llama(LlamaConfig.tiny(vocab_size=300, tie_embeddings=tie, rope_theta=5e5)))
    save_hf(model.state_dict(), model.cfg, tmp_path)
    hf = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    x = torch.randint(0, 300, (2, 29))
    with torch.no_grad():
        assert (model(x) - hf(x).logits).abs().max().item() <= 1e-4
    assert hf.config.tie_word_embeddings is tie
    assert load_hf(tmp_path).cfg == model.cfg


@pytest.mark.parametrize("tie,kv", [(True, 2), (False, 4)])
def test_hf_folder_loads_into_slimpar_with_equal_logits(tmp_path, tie, kv):
    torch.manual_seed(1)
    hf = _perturbed(LlamaForCausalLM(HFConfig(
        vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=kv, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=50000.0,
        tie_word_embeddings=tie)))
    hf.save_pretrained(tmp_path)
    model = load_hf(tmp_path).eval()
    assert model.cfg.n_kv_heads == kv and model.cfg.rope_theta == 50000.0 and model.cfg.tie_embeddings is tie
    x = torch.randint(0, 320, (2, 33))
    with torch.no_grad():
        assert (model(x) - hf(x).logits).abs().max().item() <= 1e-4


def test_foreign_folders_are_refused(tmp_path):
    with pytest.raises(HFFormatError, match="config.json"):
        load_hf(tmp_path)
    model = Llama(LlamaConfig.tiny(vocab_size=300))
    save_hf(model.state_dict(), model.cfg, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, model_type="mistral")))
    with pytest.raises(HFFormatError, match="mistral"):
        load_hf(tmp_path)
