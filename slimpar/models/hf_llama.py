"""Hugging Face LLaMA format in and out: ``config.json`` + ``model.safetensors`` with HF parameter names.

Pure mappings; ``transformers`` is not imported, so a folder written here loads with
``LlamaForCausalLM.from_pretrained`` on a machine without slimpar, and a HF folder loads here without
``transformers``. slimpar's rotary embedding uses the same rotate-half layout as HF's, so the q/k
projections map one to one (no head permutation, unlike Meta's original checkpoints).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from slimpar.models.llama import Llama, LlamaConfig
from slimpar.utils import chmod_as_created

# slimpar's block-relative names -> HF's (under "model.layers.{i}.")
_BLOCK_NAMES = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP_NAMES = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


class HFFormatError(ValueError):
    """A folder that is not a LLaMA checkpoint this mapping understands."""


def hf_name(name: str) -> str:
    """slimpar's parameter name -> HF LlamaForCausalLM's."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    head, i, rest = name.split(".", 2)  # "layers", "3", "attention.wq.weight"
    if head != "layers" or rest not in _BLOCK_NAMES:
        raise HFFormatError(f"no Hugging Face name for parameter {name!r}")
    return f"model.layers.{i}.{_BLOCK_NAMES[rest]}"


def slimpar_name(name: str) -> str:
    """HF LlamaForCausalLM's parameter name -> slimpar's."""
    inverse_top = {v: k for k, v in _TOP_NAMES.items()}
    if name in inverse_top:
        return inverse_top[name]
    inverse_block = {v: k for k, v in _BLOCK_NAMES.items()}
    parts = name.split(".", 3)  # "model", "layers", "3", "self_attn.q_proj.weight"
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in inverse_block:
        return f"layers.{parts[2]}.{inverse_block[parts[3]]}"
    raise HFFormatError(f"unexpected tensor {name!r} in a LLaMA checkpoint")


def hf_config(cfg: LlamaConfig) -> dict:
    """The ``config.json`` of HF's LlamaForCausalLM for a slimpar LlamaConfig."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim, "intermediate_size": cfg.ffn_dim, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps, "head_dim": cfg.head_dim,
        # transformers 4 reads rope_theta, 5 reads rope_parameters: write both
        "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_embeddings, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "initializer_range": cfg.init_std, "torch_dtype": "float32",
    }


def llama_config_from_hf(config: dict) -> LlamaConfig:
    """A slimpar LlamaConfig from HF's ``config.json``; refuses features slimpar's Llama does not have."""
    if config.get("model_type") != "llama":
        raise HFFormatError(f"model_type is {config.get('model_type')!r}; only 'llama' folders can be loaded")
    if config.get("hidden_act", "silu") != "silu" or config.get("attention_bias") or config.get("mlp_bias"):
        raise HFFormatError("only SwiGLU (silu) LLaMA without attention/MLP biases is supported")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise HFFormatError(f"rope type {rope.get('rope_type')!r} is not supported by slimpar's Llama (default only)")
    heads = config["num_attention_heads"]
    if config.get("head_dim") not in (None, config["hidden_size"] // heads):
        raise HFFormatError("head_dim != hidden_size / num_attention_heads is not supported")
    return LlamaConfig(
        vocab_size=config["vocab_size"], dim=config["hidden_size"], n_layers=config["num_hidden_layers"],
        n_heads=heads, n_kv_heads=config.get("num_key_value_heads") or heads, ffn_dim=config["intermediate_size"],
        max_seq_len=config.get("max_position_embeddings", 2048), norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        tie_embeddings=bool(config.get("tie_word_embeddings")),
        init_std=config.get("initializer_range", 0.02))


def to_hf_state_dict(state: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """slimpar names -> HF names; a tied head is left out (HF re-ties it from the embedding)."""
    out = {}
    for name, t in state.items():
        if tied and name == "output.weight":
            continue
        out[hf_name(name)] = t.detach().contiguous().cpu()
    return out


def save_hf(state: dict[str, torch.Tensor], cfg: LlamaConfig, out_dir: Path) -> list[Path]:
    """Write ``config.json`` and ``model.safetensors`` in HF's layout; returns the files written."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(hf_config(cfg), indent=2) + "\n")
    save_file(to_hf_state_dict(state, cfg.tie_embeddings), str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    chmod_as_created(out_dir / "model.safetensors")  # save_file leaves 0600
    return [out_dir / "config.json", out_dir / "model.safetensors"]


def read_hf_config(folder: str | Path, weights: bool = True) -> LlamaConfig:
    """The LlamaConfig of a HF-format LLaMA folder (``config.json`` + one ``model.safetensors``; with
    ``weights=False`` the config alone, for shapes)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file() or (weights and not (folder / "model.safetensors").is_file()):
        raise HFFormatError(f"{folder} needs config.json and model.safetensors (sharded checkpoints are not "
                            "supported; re-save with save_pretrained(..., max_shard_size='100GB'))")
    try:
        return llama_config_from_hf(json.loads((folder / "config.json").read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise HFFormatError(f"{folder / 'config.json'} is not a LLaMA config ({e!r})") from None


def load_hf_weights(model: Llama, folder: str | Path) -> Llama:
    """Copy a HF folder's tensors into ``model`` (whose config must match the folder's); returns it."""
    from safetensors import safe_open

    weights = Path(folder) / "model.safetensors"
    with safe_open(str(weights), framework="pt") as f:
        return copy_hf_tensors(model, {k: f.get_tensor(k) for k in f.keys()}, str(weights))


def copy_hf_tensors(model: Llama, tensors: dict[str, torch.Tensor], source: str = "state dict") -> Llama:
    """Copy tensors named as in HF's LlamaForCausalLM into ``model``; every parameter must be covered."""
    state = {slimpar_name(k): t for k, t in tensors.items() if "rotary_emb" not in k}
    if model.cfg.tie_embeddings:
        state.pop("output.weight", None)
    expected = {n for n, _ in model.named_parameters()}  # a tied head appears once, as the embedding
    if set(state) != expected:
        raise HFFormatError(f"{source}: missing {sorted(expected - set(state))[:4]}, "
                            f"unexpected {sorted(set(state) - expected)[:4]}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.shape != state[name].shape:
                raise HFFormatError(f"{source}: {name} has shape {tuple(state[name].shape)}, "
                                    f"the model expects {tuple(p.shape)}")
            p.copy_(state[name])
    return model


def from_hf_model(hf_model: torch.nn.Module) -> Llama:
    """A slimpar Llama with the weights of a ``transformers`` LlamaForCausalLM instance (copied), e.g. to
    cut it into pipeline stages with :func:`slimpar.pipeline.build_stages`."""
    cfg = llama_config_from_hf(hf_model.config.to_dict())
    return copy_hf_tensors(Llama(cfg), hf_model.state_dict(), type(hf_model).__name__)


def load_hf(folder: str | Path) -> Llama:
    """A slimpar Llama holding the weights of a HF-format LLaMA folder."""
    cfg = read_hf_config(folder)
    return load_hf_weights(Llama(cfg), folder)
