"""summary.json's speed fields: model FLOPs per token and MFU (slimpar/parallel/flops.py states the formula).

MFU is reported where every token runs the whole model once: single, DDP, FSDP2 and pipelines (the stages
together are one model). An SDP worker runs a subnetwork, so the full model's FLOPs would overstate what it
did; its ``mfu`` is None with that reason, and so are image models (no per-token count) and CPU runs.
"""

from __future__ import annotations

import torch

from slimpar.parallel.flops import llama_flops_per_token, mfu, peak_bf16
from slimpar.train.build import llama_config
from slimpar.train.modes import mode_of


def device_name(device: torch.device) -> str | None:
    """The GPU's name as the peak table matches it; None on a CPU."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def speed_fields(cfg, vocab_size: int | None, tokens_per_s: float | None, device: torch.device,
                 devices: int) -> dict:
    """``model_flops_per_token``, ``mfu`` and ``mfu_note`` (the peak's source, or why there is no MFU)."""
    if cfg.model.arch != "llama":
        return {"model_flops_per_token": None, "mfu": None, "mfu_note": "not a LLaMA: no per-token FLOP count"}
    per_token = llama_flops_per_token(llama_config(cfg, vocab_size=vocab_size), cfg.data.seq_len)
    peak = peak_bf16(device_name(device))
    if not mode_of(cfg).flops_share(cfg) and peak.flops is not None:
        return {"model_flops_per_token": per_token, "mfu": None,
                "mfu_note": "SDP workers run subnetworks: the full model's FLOPs would overstate the work"}
    return {"model_flops_per_token": per_token, "mfu": mfu(tokens_per_s, per_token, peak, devices),
            "mfu_note": peak.reason}
