"""The LLaMA model against Hugging Face's LlamaForCausalLM on identical weights, and its deletion API."""

import pytest
import torch
from transformers import LlamaConfig as HFConfig
from transformers import LlamaForCausalLM

from slimpar.models.llama import Llama, LlamaConfig


def _hf_from_ours(model: Llama) -> LlamaForCausalLM:
    c = model.cfg
    hf = LlamaForCausalLM(HFConfig(
        vocab_size=c.vocab_size, hidden_size=c.dim, intermediate_size=c.ffn_dim, num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, max_position_embeddings=c.max_seq_len,
        rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta, tie_word_embeddings=c.tie_embeddings,
        attention_bias=False, mlp_bias=False, hidden_act="silu"))
    sd = {"model.embed_tokens.weight": model.tok_embeddings.weight, "model.norm.weight": model.norm.weight,
          "lm_head.weight": model.output.weight}
    names = {"attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
             "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
             "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj",
             "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    for i, layer in model.layers.items():
        for ours, theirs in names.items():
            sd[f"model.layers.{i}.{theirs}.weight"] = layer.get_submodule(ours).weight
    missing, unexpected = hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return hf.eval()


@pytest.mark.parametrize("tie,kv", [(True, 2), (False, 4)])
def test_logits_match_hugging_face(tie, kv):
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny(vocab_size=300, n_kv_heads=kv, tie_embeddings=tie)).eval()
    for p in model.parameters():  # move norms off 1.0 so they are exercised
        if p.dim() == 1:
            p.data.uniform_(0.5, 1.5)
    hf = _hf_from_ours(model)
    x = torch.randint(0, 300, (2, 37))
    with torch.no_grad():
        diff = (model(x) - hf(x).logits).abs().max().item()
    assert diff <= 1e-4, diff


def test_named_sizes_parameter_counts():
    small = Llama(LlamaConfig.small(vocab_size=4096))
    assert 5e6 <= small.num_params() <= 20e6
    counts = {s: _count(LlamaConfig.named(s, vocab_size=32000, tie_embeddings=False)) for s in ("134m", "500m", "1b")}
    assert 120e6 <= counts["134m"] <= 150e6 and 450e6 <= counts["500m"] <= 600e6 and 0.9e9 <= counts["1b"] <= 1.2e9


def _count(cfg: LlamaConfig) -> int:
    d, f, hd = cfg.dim, cfg.ffn_dim, cfg.head_dim
    attn = d * cfg.n_heads * hd * 2 + d * cfg.n_kv_heads * hd * 2
    block = attn + 3 * d * f + 2 * d
    emb = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    with torch.device("meta"):
        n = Llama(cfg).num_params()
    assert n == cfg.n_layers * block + emb + d
    return n


def test_stage_split_by_deletion_equals_full_model():
    torch.manual_seed(0)
    full = Llama(LlamaConfig.tiny(vocab_size=300, tie_embeddings=False)).eval()
    first, second = Llama(full.cfg), Llama(full.cfg)
    first.load_state_dict(full.state_dict())
    second.load_state_dict(full.state_dict())
    for k in ("2", "3"):
        del first.layers[k]
    for k in ("0", "1"):
        del second.layers[k]
    first.norm = first.output = None
    second.tok_embeddings = None
    names = {n for n, _ in first.named_parameters()} | {n for n, _ in second.named_parameters()}
    assert names == {n for n, _ in full.named_parameters()}
    x = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        h = first(x)
        assert h.shape == (2, 16, full.cfg.dim)
        torch.testing.assert_close(second(h), full(x))


def test_residual_scale_zero_makes_block_identity():
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny(vocab_size=300)).eval()
    without = Llama(model.cfg).eval()
    without.load_state_dict(model.state_dict())
    del without.layers["1"]
    model.layers["1"].residual_scale = 0.0
    x = torch.randint(0, 300, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(x), without(x))
