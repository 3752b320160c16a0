"""``slimpar sample --run DIR --prompt TEXT``: generate text from a finished run's exported model.

The run's own tokenizer (``tokenizer.json``) encodes the prompt after an end-of-text token (the start of a
document, as in training and in ``slimpar eval --lm-eval``); the model of ``model.safetensors`` continues it one
token at a time over its last ``max_seq_len`` tokens, and generation stops early at an end-of-text token.
Temperature 0 is greedy; otherwise tokens are drawn from the softmax of logits / temperature, restricted to the
``top_k`` most likely when top_k > 0, with a ``torch.Generator`` seeded by ``seed``: the same seed gives the
same text. Every argument and the run folder are checked before anything is loaded (exit 2).
"""

from __future__ import annotations

import math
from pathlib import Path

from slimpar.config import Config, ConfigError, load_config
from slimpar.train.job.run_files import TOKENIZER_FILE

CODEC_PREFIX = "codecs."  # a pipeline run's export keeps its boundary codecs' state beside the model's


def check_sample_args(max_new_tokens: int, temperature: float, top_k: int) -> None:
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"--temperature must be a finite number >= 0, 0 for greedy (got {temperature})")
    if top_k < 0:
        raise ConfigError(f"--top-k must be >= 0, 0 for the whole vocabulary (got {top_k})")


def check_sample_run(run_dir: Path) -> Config:
    """The run folder can be sampled: a finished LLaMA text run with its export and its tokenizer."""
    cfg_path, weights = run_dir / "config.toml", run_dir / "model.safetensors"
    if not run_dir.is_dir():
        raise ConfigError(f"--run {run_dir}: no such folder; give a folder written by slimpar train")
    for p in (cfg_path, weights):
        if not p.is_file():
            raise ConfigError(f"{p} not found: --run must be a finished `slimpar train` folder with an export "
                              "(checkpoint.export = true)")
    cfg = load_config(cfg_path)
    if cfg.model.arch != "llama" or cfg.data.kind != "text":
        raise ConfigError(f"{run_dir} is not a text run (model.arch = {cfg.model.arch!r}, data.kind = "
                          f"{cfg.data.kind!r}); slimpar sample needs a LLaMA run on text")
    if not (run_dir / TOKENIZER_FILE).is_file():
        raise ConfigError(f"{run_dir / TOKENIZER_FILE} not found: the run kept no tokenizer (pre-tokenized data), "
                          "so a text prompt cannot be encoded")
    return cfg


def load_run_llama(run_dir: Path, cfg: Config):
    """The run's exported LLaMA in eval mode (a pipeline's codec state left out: the model without its codecs)."""
    from slimpar.models.llama import Llama
    from slimpar.train.build import llama_config
    from slimpar.train.checkpoint.export import load_safetensors, verify_export

    verify_export(run_dir)  # model.safetensors against the run's manifest.json, before anything reads it
    state = load_safetensors(run_dir / "model.safetensors")
    state = {k: v for k, v in state.items() if not k.startswith(CODEC_PREFIX)}
    model = Llama(llama_config(cfg, vocab_size=state["tok_embeddings.weight"].shape[0]))
    model.load_state_dict(state, strict=True)
    return model.eval()


def generate(model, ids: list[int], max_new_tokens: int, temperature: float, top_k: int, seed: int,
             stop_id: int | None) -> list[int]:
    """The new token ids after ``ids`` (without the stop token, at which it ends)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ctx, out = model.cfg.max_seq_len, []
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([(ids + out)[-ctx:]]))[0, -1].float()  # (V,)
            if temperature == 0:
                token = int(logits.argmax())
            else:
                logits = logits / temperature
                if 0 < top_k < logits.numel():
                    kth = torch.topk(logits, top_k).values[-1]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            if token == stop_id:
                break
            out.append(token)
    return out


def sample_run(run_dir: Path, prompt: str, max_new_tokens: int = 64, temperature: float = 0.8, top_k: int = 50,
               seed: int = 0) -> str:
    """The prompt's continuation (text only, without the prompt)."""
    check_sample_args(max_new_tokens, temperature, top_k)
    cfg = check_sample_run(run_dir)
    from tokenizers import Tokenizer

    from slimpar.data.tokenizer import EOT

    tokenizer = Tokenizer.from_file(str(run_dir / TOKENIZER_FILE))
    tokenizer.encode_special_tokens = True  # a literal "<|endoftext|>" in the prompt is text, as in training
    eot = tokenizer.token_to_id(EOT)
    ids = ([eot] if eot is not None else []) + tokenizer.encode(prompt).ids
    model = load_run_llama(run_dir, cfg)
    return tokenizer.decode(generate(model, ids, max_new_tokens, temperature, top_k, seed, eot))


def sample_command(run: str, prompt: str, max_new_tokens: int, temperature: float, top_k: int, seed: int) -> int:
    print(prompt + sample_run(Path(run), prompt, max_new_tokens, temperature, top_k, seed), flush=True)
    return 0
