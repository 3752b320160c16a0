"""``slimpar.sdp.virtual.VirtualSDP``: in-process holder averaging, clipping, refresh and gather against
hand computations on a toy plan (tiny LLaMA, 3 workers, an explicit mask with holder sets of size 1, 2 and 3)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from slimpar.models.llama import Llama, LlamaConfig
from slimpar.sdp.components import model_components
from slimpar.sdp.plan import plan_components
from slimpar.sdp.virtual import VirtualSDP, ring_sum

# blocks 0..3: block 0 held by worker 0 only, block 1 by {0, 2}, block 2 by {1, 2}, block 3 by everyone
MASK = np.array([[1, 1, 0, 1], [0, 0, 1, 1], [0, 1, 1, 1]], dtype=np.uint8)


def _model() -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaConfig.tiny(vocab_size=64))


def _plan(model, level: str = "block", groups: int = 1):
    comps, shared, shared_bytes = model_components(model, level, groups)
    mask = MASK if level == "block" else _neuron_mask(comps)
    params = dict(model.named_parameters())
    return plan_components(comps, shared_bytes, 3, mask=mask, assignment="explicit", shared_params=shared,
                           shared_numel=sum(params[n].numel() for n in shared))


def _neuron_mask(comps) -> np.ndarray:
    """Per layer, unit group g is held by workers {g % 3, (g + 1) % 3}: every worker holds some of every layer."""
    mask = np.zeros((3, len(comps)), dtype=np.uint8)
    for c, comp in enumerate(comps):
        g = (comp.index[0] // (comp.index[1] - comp.index[0]))
        mask[g % 3, c] = mask[(g + 1) % 3, c] = 1
    return mask


def _fill_grads(v: VirtualSDP) -> list[dict[str, torch.Tensor]]:
    """A distinct random gradient on every trainable parameter of every worker; returns copies."""
    g = torch.Generator().manual_seed(1)
    out = []
    for m in v.modules:
        mine = {}
        for name, p in m.named_parameters():
            if p.requires_grad:
                p.grad = torch.randn(p.shape, generator=g)
                mine[name] = p.grad.clone()
        out.append(mine)
    return out


def test_sync_averages_blocks_over_exactly_their_holders():
    model = _model()
    plan = _plan(model)
    v = VirtualSDP(model, plan, regime="forward")
    before = _fill_grads(v)
    v.sync()
    for c, comp in enumerate(plan.components):
        holders = plan.holders(c)
        for name in comp.params:
            want = sum(before[w][name] for w in holders) / len(holders)
            for w in holders:
                got = dict(v.modules[w].named_parameters())[name].grad
                if len(holders) == 1:
                    assert torch.equal(got, before[w][name])  # never communicated, untouched
                else:
                    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
            for w in set(range(3)) - set(holders):  # forward regime: a non-holder has no such parameter
                assert name not in dict(v.modules[w].named_parameters())
    for name in plan.shared_params:
        want = sum(before[w][name] for w in range(3)) / 3
        for w in range(3):
            torch.testing.assert_close(dict(v.modules[w].named_parameters())[name].grad, want, rtol=1e-6, atol=1e-7)
    v.check_replicas()  # every holder now has the same averaged gradient; parameters were never touched


def test_sync_neuron_slices_and_clip_norm_by_hand():
    """Neuron level (sliced tensors): each unit group averaged over its two holders; the clip norm counts
    every component and the shared parameters once, and all workers are scaled by the same factor."""
    model = _model()
    full = dict(copy.deepcopy(model).named_parameters())
    plan = _plan(model, "neuron", 4)
    v = VirtualSDP(model, plan, regime="forward")
    before = _fill_grads(v)
    # hand average of every component's rows/columns, in global coordinates
    want: dict[str, torch.Tensor] = {n: torch.zeros_like(full[n]) for c in plan.components for n in c.params}
    for c, comp in enumerate(plan.components):
        holders = plan.holders(c)
        for name, dim in zip(comp.params, comp.dims, strict=True):
            acc = 0
            for w in holders:
                local_dim, idx = v.subs[w].index_map[name]
                pos = int((idx == comp.index[0]).nonzero()[0])
                acc = acc + before[w][name].narrow(local_dim, pos, comp.index[1] - comp.index[0])
            want[name].narrow(dim, *comp.index[:1], comp.index[1] - comp.index[0]).copy_(acc / len(holders))
    shared = {n: sum(before[w][n] for w in range(3)) / 3 for n in plan.shared_params}
    v.sync()
    for w in range(3):
        params = dict(v.modules[w].named_parameters())
        for name, (dim, idx) in v.subs[w].index_map.items():
            torch.testing.assert_close(params[name].grad, want[name].index_select(dim, idx), rtol=1e-6, atol=1e-7)
    sq = sum(float(t.double().pow(2).sum()) for t in want.values()) + sum(
        float(t.double().pow(2).sum()) for t in shared.values())
    grads = [[p.grad.clone() for p in m.parameters()] for m in v.modules]
    norm = v.clip_grad_norm_(0.5)
    assert norm == pytest.approx(math.sqrt(sq), rel=1e-6)
    scale = 0.5 / (norm + 1e-6)
    for m, gs in zip(v.modules, grads, strict=True):
        for p, g in zip(m.parameters(), gs, strict=True):
            torch.testing.assert_close(p.grad, g * scale)


@pytest.mark.parametrize("level,groups", [("block", 1), ("neuron", 4)])
def test_backward_refresh_and_gather(level, groups):
    """Backward regime: a non-holder's copy takes its first holder's values at refresh (and the drift is the
    change); the gathered full model takes every tensor from its first holder, shared ones from worker 0."""
    model = _model()
    reference = copy.deepcopy(model)
    plan = _plan(model, level, groups)
    v = VirtualSDP(model, plan, regime="backward")
    gathered = v.gather_full_model()
    for name, t in reference.state_dict().items():  # nothing trained yet: the gather rebuilds the model exactly
        assert torch.equal(gathered.state_dict()[name], t), name
    c = next(c for c in range(len(plan.components)) if len(plan.holders(c)) < 3)
    src = plan.holders(c)[0]
    with torch.no_grad():
        for t in v.subs[src].views[c]:
            t.add_(0.25)
    v.refresh()
    assert v.last_drift == pytest.approx(0.25)
    for w in set(range(3)) - set(plan.holders(c)):  # only non-holders are refreshed (holders stay in step)
        for a, b in zip(v.subs[w].views[c], v.subs[src].views[c], strict=True):
            assert torch.equal(a, b)
    moved = v.gather_full_model().state_dict()
    comp = plan.components[c]
    for name, dim in zip(comp.params, comp.dims or [None] * len(comp.params), strict=True):
        ref = reference.state_dict()[name]
        region = ref if comp.index is None else ref.narrow(dim, comp.index[0], comp.index[1] - comp.index[0])
        got = moved[name] if comp.index is None else moved[name].narrow(dim, comp.index[0],
                                                                        comp.index[1] - comp.index[0])
        torch.testing.assert_close(got, region + 0.25)


def test_ring_sum_order():
    """ring_sum is a sum (to rounding), is exact for k <= 2, and adds in gloo's ring order: segment s of 2k
    starts at rank s // 2 - 1 and descends."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(1001, generator=g) * torch.exp(torch.randn(1001, generator=g) * 3) for _ in range(4)]
    torch.testing.assert_close(ring_sum(xs), xs[0] + xs[1] + xs[2] + xs[3], rtol=1e-5, atol=1e-5)
    assert torch.equal(ring_sum(xs[:2]), xs[0] + xs[1])
    seg = -(-1001 // 8)
    first = slice(0, seg)  # segment 0, chunk 0: ((x3 + x2) + x1) + x0
    assert torch.equal(ring_sum(xs)[first], ((xs[3][first] + xs[2][first]) + xs[1][first]) + xs[0][first])
