"""Batched virtual SDP's checkpoints are the full-model format: they resume in the sequential virtual run (and so
in the real one, tests/distributed/test_sdp_virtual_resume.py) and the other way round; and its config checks.

Tiny LLaMA (fp32), 4 workers, neuron level with keep 0.5 (sliced tensors on the sequential side), 2 AdamW steps
then a save; the loading side starts from another initialisation. Right after the load the sequential run's
gathered full model equals the batched copy bit for bit; one more step on each stays equal to rounding
(AdamW's moments came across too: a lost moment would change the step by far more than ``TOL``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from slimpar.config import ConfigError
from slimpar.models.llama import Llama, LlamaConfig
from slimpar.sdp.batched import BatchedSDP
from slimpar.sdp.planner import plan_model
from slimpar.sdp.virtual import VirtualSDP
from slimpar.train.checkpoint.dcp import OPTIONS, load_checkpoint, save_checkpoint
from slimpar.train.checkpoint.sdp import VirtualSDPFullState
from slimpar.train.validate.checks import load_run_config
from tests.helpers import TINY

N = 4
TOL = dict(rtol=1e-5, atol=1e-6)


def _model(seed: int) -> Llama:
    torch.manual_seed(seed)
    return Llama(LlamaConfig.tiny(vocab_size=64))


def _batch(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randint(0, 64, (2, 17), generator=g) for _ in range(N)]


def _loss(logits: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten())


class _Batched:
    def __init__(self, seed: int):
        self.model = _model(seed)
        self.b = BatchedSDP(self.model, plan_model(self.model, N, 0.5, level="neuron", groups=4))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.ckpt = self.model

    def step(self, step: int) -> None:
        xs = _batch(step)
        with self.b.rows([len(x) for x in xs]):
            logits = self.model(torch.cat(xs)[:, :-1])
            sum(_loss(lg, x) for lg, x in zip(logits.split(self.b.counts), xs, strict=True)).backward()
        self.b.average_grads()
        self.opt.step()
        self.opt.zero_grad()

    def full(self) -> dict[str, torch.Tensor]:
        return dict(self.b.full_model().named_parameters())


class _Sequential:
    def __init__(self, seed: int):
        model = _model(seed)
        shapes = {k: tuple(t.shape) for k, t in model.state_dict().items()}
        self.v = VirtualSDP(model, plan_model(model, N, 0.5, level="neuron", groups=4))
        container = nn.ModuleDict({f"worker{w}": nn.ModuleDict({"module": m}) for w, m in enumerate(self.v.modules)})
        self.opt = torch.optim.AdamW([p for p in container.parameters() if p.requires_grad], lr=1e-2)
        self.ckpt = VirtualSDPFullState(self.v, container, shapes, OPTIONS)

    def step(self, step: int) -> None:
        for m, x in zip(self.v.modules, _batch(step), strict=True):
            _loss(m(x[:, :-1]), x).backward()
        self.v.sync()
        self.opt.step()
        self.opt.zero_grad()

    def full(self) -> dict[str, torch.Tensor]:
        return dict(self.v.gather_full_model().named_parameters())


@pytest.mark.parametrize(("writer", "reader"), [(_Batched, _Sequential), (_Sequential, _Batched)])
def test_batched_and_sequential_checkpoints_resume_each_other(tmp_path, writer, reader):
    a = writer(0)
    for step in range(2):
        a.step(step)
    path = save_checkpoint(tmp_path, 2, a.ckpt, a.opt, rank=0)
    b = reader(1)
    assert load_checkpoint(path, b.ckpt, b.opt) == 2
    want, got = a.full(), b.full()
    for name, p in want.items():
        assert torch.equal(got[name], p), name
    a.step(2)
    b.step(2)
    want, got = a.full(), b.full()
    for name, p in want.items():
        torch.testing.assert_close(got[name], p, **TOL, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize(("overrides", "message"), [
    (["--sdp.virtual_batched", "true"], "add --sdp.virtual true"),
    (["--sdp.virtual", "true", "--sdp.virtual_batched", "true", "--sdp.regime", "backward",
      "--sdp.refresh_every", "2"], "--sdp.refresh_every 1 only"),
    (["--config", "resnet", "--sdp.virtual", "true", "--sdp.virtual_batched", "true"], "supports --model.arch llama"),
])
def test_batched_config_errors_say_the_fix(overrides, message):
    config = TINY
    if overrides[:2] == ["--config", "resnet"]:
        config, overrides = TINY.parent / "resnet_tiny.toml", overrides[2:]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_run_config(config, ["--parallel.mode", "sdp", *overrides])
