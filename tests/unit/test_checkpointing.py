"""Activation checkpointing (applied from outside) gives the same gradients and saves activations."""

import torch

from slimpar.models.llama import Llama, LlamaConfig
from slimpar.parallel.ac import apply_ac
from slimpar.train.memory.accounting import SavedActivations, param_storages


def _grads(model, x):
    model.zero_grad()
    saved = SavedActivations(exclude=param_storages(model))
    with saved.record():
        loss = model(x).float().logsumexp(-1).mean()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, saved.bytes


def test_checkpointing_keeps_names_and_gradients():
    torch.manual_seed(0)
    plain = Llama(LlamaConfig.tiny(vocab_size=300))
    ckpt = Llama(plain.cfg)
    ckpt.load_state_dict(plain.state_dict())
    apply_ac(ckpt.layers)
    assert [n for n, _ in ckpt.named_parameters()] == [n for n, _ in plain.named_parameters()]
    x = torch.randint(0, 300, (4, 32))
    g_plain, act_plain = _grads(plain, x)
    g_ckpt, act_ckpt = _grads(ckpt, x)
    for name in g_plain:
        torch.testing.assert_close(g_ckpt[name], g_plain[name], rtol=1e-5, atol=1e-7)
    assert act_ckpt < act_plain / 2
