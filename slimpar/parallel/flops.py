"""Model FLOPs per token and model FLOPs utilization (MFU) against a GPU's bf16 dense peak.

``model_flops_per_token`` follows PaLM's accounting (Chowdhery et al. 2022, appendix B; torchtitan uses the same):

    6 · N + 12 · L · d · T

- N: the parameters that take part in a matrix product: every parameter except the token embedding (a lookup),
  the output head included (a tied head counts its matrix once, for its product); norms' scales are included as
  torchtitan does, a rounding error;
- 6 · N: forward (2 FLOPs per multiply-add) and backward (twice the forward);
- 12 · L · d · T: attention's scores and weighted sum, Q·Kᵀ and A·V, 2 · 2 · d · T per token and layer forward,
  times 3 with backward; L layers, d = heads × head dim, T the sequence length. The causal mask's half is *not*
  taken off (PaLM's convention), so MFU is comparable with torchtitan's and the papers'.

Activation recomputation (activation checkpointing) is not counted: MFU counts the model's FLOPs, not the
hardware's. MFU = tokens/s · FLOPs per token / (devices · peak).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# bf16 dense (no 2:4 sparsity) Tensor Core peak, TFLOP/s, matched in order on torch.cuda.get_device_name()
# (the first pattern that matches wins, so the more specific names come first).
PEAK_BF16_TFLOPS: tuple[tuple[str, float, str], ...] = (
    (r"H200 NVL", 835.0, "NVIDIA H200 NVL datasheet: 1,671 TFLOPS with sparsity, halved"),
    (r"H200", 989.0, "NVIDIA H200 SXM datasheet (2024): 1,979 TFLOPS with sparsity, halved"),
    (r"H100 NVL", 835.0, "NVIDIA H100 NVL datasheet: 1,671 TFLOPS with sparsity, halved"),
    (r"H100 PCIe", 756.0, "NVIDIA H100 PCIe datasheet (2022): 1,513 TFLOPS with sparsity, halved"),
    (r"H100", 989.0, "NVIDIA H100 SXM5 datasheet (2022): 1,979 TFLOPS with sparsity, halved"),
    (r"A100", 312.0, "NVIDIA A100 datasheet (2020): 312 TFLOPS dense, SXM and PCIe alike"),
    (r"L40S", 362.0, "NVIDIA L40S datasheet (2023): 733 TFLOPS with sparsity, halved"),
    (r"\bL4\b", 121.0, "NVIDIA L4 datasheet (2023): 242 TFLOPS with sparsity, halved"),
    (r"\bA10\b", 125.0, "NVIDIA A10 datasheet (2021): 250 TFLOPS with sparsity, halved"),
)


@dataclass(frozen=True)
class Peak:
    """A device's bf16 dense peak in FLOP/s, or None with the reason there is none."""

    flops: float | None
    reason: str  # the table row's source, or why there is no peak ("cpu", "unknown device: NAME")


def peak_bf16(device_name: str | None) -> Peak:
    """The bf16 dense peak of the GPU named ``device_name`` (``torch.cuda.get_device_name()``); None: a CPU."""
    if device_name is None:
        return Peak(None, "cpu")
    for pattern, tflops, source in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name):
            return Peak(tflops * 1e12, source)
    return Peak(None, f"unknown device: {device_name}")


def llama_flops_per_token(cfg, seq_len: int) -> int:
    """6 · N + 12 · L · d · T for a ``LlamaConfig`` (module docstring), from the config alone."""
    d, hd, layers = cfg.dim, cfg.head_dim, cfg.n_layers
    attention = d * cfg.n_heads * hd * 2 + d * cfg.n_kv_heads * hd * 2  # wq, wo; wk, wv
    block = attention + 3 * d * cfg.ffn_dim + 2 * d  # SwiGLU's three matrices, two norms
    n = layers * block + d + cfg.vocab_size * d  # final norm, head
    return 6 * n + 12 * layers * cfg.n_heads * hd * seq_len


def mfu(tokens_per_s: float | None, flops_per_token: int | None, peak: Peak, devices: int = 1) -> float | None:
    """Achieved model FLOP/s over ``devices`` times the peak; None without a peak or a rate."""
    if peak.flops is None or not tokens_per_s or not flops_per_token:
        return None
    return tokens_per_s * flops_per_token / (devices * peak.flops)
