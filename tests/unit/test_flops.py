"""Model FLOPs per token (6·N + 12·L·d·T) against a hand count for llama_tiny, and the GPU peak table."""

import pytest

from slimpar.models.llama import Llama, LlamaConfig
from slimpar.parallel.flops import Peak, llama_flops_per_token, mfu, peak_bf16


def test_llama_tiny_flops_by_hand():
    # llama_tiny as configs/llama_tiny.toml runs it: d 64, 4 layers, 4 heads (head dim 16), 2 kv heads, d_ff 176,
    # vocabulary 512, T 64. A block: wq, wo 64·64 each; wk, wv 64·32 each; SwiGLU 3·64·176; two norms 64 each.
    block = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176 + 2 * 64
    n = 4 * block + 64 + 512 * 64  # final norm, head (a matrix product; the embedding lookup is not)
    assert block == 46_208 and n == 217_664
    expected = 6 * n + 12 * 4 * 64 * 64
    cfg = LlamaConfig.tiny(vocab_size=512)
    assert llama_flops_per_token(cfg, 64) == expected == 1_502_592
    assert n == Llama(cfg).num_params()  # tied: the one matrix counts once, for the head's product
    untied = Llama(LlamaConfig.tiny(vocab_size=512, tie_embeddings=False))
    assert llama_flops_per_token(untied.cfg, 64) == 6 * (untied.num_params() - 512 * 64) + 12 * 4 * 64 * 64


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756), ("NVIDIA H100 NVL", 835), ("NVIDIA H200", 989),
    ("NVIDIA H200 NVL", 835), ("NVIDIA A100-SXM4-80GB", 312), ("NVIDIA A100 80GB PCIe", 312), ("NVIDIA L4", 121),
    ("NVIDIA L40S", 362), ("NVIDIA A10", 125)])
def test_known_gpus(name, tflops):
    peak = peak_bf16(name)
    assert peak.flops == tflops * 1e12 and "datasheet" in peak.reason


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA L40", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090"])
def test_unknown_gpus_have_no_peak(name):
    assert peak_bf16(name) == Peak(None, f"unknown device: {name}")


def test_mfu():
    assert peak_bf16(None) == Peak(None, "cpu")
    assert mfu(1000.0, 10**9, peak_bf16(None)) is None
    assert mfu(1e5, 10**9, peak_bf16("NVIDIA H200"), devices=2) == pytest.approx(1e14 / (2 * 989e12))
