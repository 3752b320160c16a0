"""``slimpar export --hf RUN OUT``: a finished run as a Hugging Face LLaMA folder.

OUT gets ``config.json``, ``model.safetensors`` with HF parameter names, and the run's tokenizer as
``tokenizer.json`` + ``tokenizer_config.json``, so that ``LlamaForCausalLM.from_pretrained(OUT)`` and
``AutoTokenizer.from_pretrained(OUT)`` load it without slimpar. A pipeline run's boundary codec state
(``codecs.*`` in the run's export) is no part of the model: it goes beside it, in ``codecs.safetensors``
(names without the ``codecs.`` prefix, e.g. ``send0.projector.A``; docs/huggingface.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from slimpar.commands.evaluate import split_codec_state
from slimpar.config import ConfigError, load_config
from slimpar.data.tokenizer import EOT
from slimpar.models.hf_llama import HFFormatError, save_hf
from slimpar.train.build import llama_config
from slimpar.train.checkpoint.export import load_safetensors, verify_export
from slimpar.train.checkpoint.init_from import check_init_from
from slimpar.train.checkpoint.manifest import MANIFEST, write_manifest
from slimpar.train.job.run_files import TOKENIZER_FILE
from slimpar.utils import chmod_as_created

CODECS_FILE = "codecs.safetensors"


def export_hf(run_dir: Path, out_dir: Path) -> list[Path]:
    """Write the HF folder; refuses a non-LLaMA run, a run without an export, or a non-empty OUT."""
    cfg_path, weights = run_dir / "config.toml", run_dir / "model.safetensors"
    for p in (cfg_path, weights):
        if not p.is_file():
            raise ConfigError(f"{p} not found: RUN must be a finished `slimpar train` folder with an export "
                              "(checkpoint.export = true)")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError(f"{out_dir} exists and is not empty (or not a folder); choose a new folder for the export")
    verify_export(run_dir)  # model.safetensors against the run's manifest.json, before anything reads it
    cfg = load_config(cfg_path)
    if cfg.model.arch != "llama":
        raise ConfigError(f"only LLaMA runs export to the Hugging Face format (this run: {cfg.model.arch})")
    check_init_from(cfg, run_dir)  # llama_config reads the init_from folder's config.json
    state, codecs = split_codec_state(load_safetensors(weights))
    lc = llama_config(cfg, vocab_size=state["tok_embeddings.weight"].shape[0])
    try:
        written = save_hf(state, lc, out_dir)
    except HFFormatError as e:
        raise ConfigError(f"{weights}: {e}") from None
    if codecs:
        written.append(_write_codecs(codecs, out_dir / CODECS_FILE))
    tokenizer = run_dir / TOKENIZER_FILE
    if tokenizer.is_file():
        written += _write_tokenizer(tokenizer, out_dir, lc.max_seq_len)
    write_manifest(out_dir, [p.relative_to(out_dir).as_posix() for p in written])  # sha256 of what was written
    return written + [out_dir / MANIFEST]


def _write_codecs(codecs: dict[str, torch.Tensor], path: Path) -> Path:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in codecs.items()}, str(path), metadata={"format": "pt"})
    chmod_as_created(path)  # save_file leaves 0600
    return path


def _write_tokenizer(tokenizer: Path, out_dir: Path, max_len: int) -> list[Path]:
    shutil.copyfile(tokenizer, out_dir / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOT, "bos_token": EOT,
              "unk_token": EOT, "model_max_length": max_len, "clean_up_tokenization_spaces": False}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return [out_dir / "tokenizer.json", out_dir / "tokenizer_config.json"]


def export_command(run: str, out: str) -> int:
    written = export_hf(Path(run), Path(out))
    for p in written:
        print(f"wrote {p}")
    if not any(p.name == "tokenizer.json" for p in written):
        print("note: the run kept no tokenizer (pre-tokenized data); the export has none")
    return 0
