"""Virtual SDP's checkpoint in the full-name format (``VirtualSDPFullState``), in one process.

Tiny LLaMA, 3 simulated workers, neuron level (sliced tensors, held/frozen splits in the backward regime),
two AdamW steps. The saved model is the gathered full model bit for bit, under the model's own names, with
one AdamW state per full parameter; a fresh virtual run of another initialisation that loads it gets every
worker's parameters and optimizer state back bit for bit, none of them shared between workers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn

from slimpar.models.llama import Llama, LlamaConfig
from slimpar.sdp.components import model_components
from slimpar.sdp.plan import plan_components
from slimpar.sdp.virtual import VirtualSDP
from slimpar.train.checkpoint.dcp import OPTIONS
from slimpar.train.checkpoint.sdp import VirtualSDPFullState

N = 3


def _run(seed: int, regime: str, steps: int):
    """(VirtualSDP, its container, optimizer, full-state view) after ``steps`` steps from init ``seed``."""
    torch.manual_seed(seed)
    model = Llama(LlamaConfig.tiny(vocab_size=64))
    comps, shared, shared_bytes = model_components(model, "neuron", 4)
    mask = np.zeros((N, len(comps)), dtype=np.uint8)  # unit group g held by workers g % 3 and (g + 1) % 3
    for c, comp in enumerate(comps):
        g = comp.index[0] // (comp.index[1] - comp.index[0])
        mask[g % N, c] = mask[(g + 1) % N, c] = 1
    params = dict(model.named_parameters())
    plan = plan_components(comps, shared_bytes, N, mask=mask, assignment="explicit", shared_params=shared,
                           shared_numel=sum(params[n].numel() for n in shared))
    shapes = {k: tuple(t.shape) for k, t in model.state_dict().items()}
    v = VirtualSDP(model, plan, regime=regime)
    container = nn.ModuleDict({f"worker{w}": nn.ModuleDict({"module": m}) for w, m in enumerate(v.modules)})
    opt = torch.optim.AdamW([p for p in container.parameters() if p.requires_grad], lr=1e-2)
    data = torch.Generator().manual_seed(7)
    for _ in range(steps):
        for m in v.modules:
            x = torch.randint(0, 64, (2, 16), generator=data)
            F.cross_entropy(m(x)[:, :-1].flatten(0, 1), x[:, 1:].flatten()).backward()
        v.sync()
        opt.step()
        opt.zero_grad()
        v.refresh()
    return v, container, opt, VirtualSDPFullState(v, container, shapes, OPTIONS)


@pytest.mark.parametrize("regime", ["forward", "backward"])
def test_virtual_checkpoint_is_the_full_model_and_loads_back(tmp_path, regime):
    v, container, opt, state = _run(0, regime, 2)
    model_sd, optim_sd = state.state_to_save(opt)
    full = v.gather_full_model().state_dict()
    assert set(model_sd) == set(full)  # the model's own names, one copy each
    for k, t in full.items():
        assert torch.equal(model_sd[k], t), k
    trainable = {n for n, p in v.gather_full_model().named_parameters()}
    assert {k.rsplit(".", 1)[0][len("state."):] for k in optim_sd if k.startswith("state.")} == trainable
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp_path))

    v2, container2, opt2, state2 = _run(1, regime, 0)
    state2.load_from(tmp_path, opt2)
    before, after = dict(container.named_parameters()), dict(container2.named_parameters())
    seen: set[int] = set()
    for name, p in before.items():
        assert torch.equal(after[name], p), name
        got, want = opt2.state.get(after[name], {}), opt.state.get(p, {})
        assert set(got) == set(want), name
        for key, t in want.items():
            assert torch.equal(got[key], t), (name, key)
            assert id(got[key]) not in seen, (name, key)  # AdamW would update a shared moment N times
            seen.add(id(got[key]))
    v2.check_replicas()
