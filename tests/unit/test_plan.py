"""SDP planner: graph metrics against a dense eigen-solver and hand computation, assignment
guarantees (coverage, balance, determinism), error messages, and component extraction."""

import json

import numpy as np
import pytest
import scipy.linalg
import torch
from torch import nn

from slimpar.models.llama import Llama, LlamaConfig
from slimpar.sdp.components import Component, llama_components, resnet_components, swin_components
from slimpar.sdp.plan import (
    PlanError,
    analytic_bytes_per_step,
    averaging_operator,
    load_mask_file,
    masking_error,
    plan_components,
    spectral_gap,
)
from slimpar.sdp.planner import plan_blocks, plan_neurons


def _comps(sizes: list[int]) -> list[Component]:
    return [Component(f"c{i}", param_bytes=4 * s, flops=2 * s, params=(f"p{i}",), numel=s)
            for i, s in enumerate(sizes)]


def _dense_gap(mask: np.ndarray) -> float:
    """1 - lambda_2 of the non-symmetric W itself, from scipy's general eigen-solver."""
    m = mask.astype(float)
    w = np.diag(1 / m.sum(1)) @ m @ np.diag(1 / m.sum(0)) @ m.T
    lam = sorted(scipy.linalg.eigvals(w).real, reverse=True)
    return 1 - lam[1]


@pytest.fixture(scope="module")
def tiny() -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaConfig.tiny(vocab_size=256))


# ----- graph metrics ------------------------------------------------------------------------------

@pytest.mark.parametrize("n,k,keep,seed", [(3, 5, 0.5, 0), (4, 8, 0.4, 1), (6, 7, 0.6, 2), (8, 16, 0.3, 3),
                                           (16, 4, 0.5, 4), (12, 3, 0.4, 5), (5, 1, 0.6, 6), (40, 7, 0.3, 7)])
def test_spectral_gap_matches_dense_eigensolver(n, k, keep, seed):
    rng = np.random.default_rng(seed)
    plan = plan_components(_comps(list(rng.integers(10, 100, k))), 0, n, keep, assignment="random", seed=seed)
    assert plan.spectral_gap == pytest.approx(_dense_gap(plan.mask), abs=1e-9)
    np.testing.assert_allclose(averaging_operator(plan.mask).sum(1), 1.0, atol=1e-12)


def test_spectral_gap_of_random_explicit_masks():
    rng = np.random.default_rng(7)
    for _ in range(10):
        mask = (rng.random((5, 6)) < 0.5).astype(np.uint8)
        mask[:, mask.sum(0) == 0] = 1
        mask[mask.sum(1) == 0, 0] = 1
        plan = plan_components(_comps([1] * 6), 0, 5, assignment="explicit", mask=mask)
        assert plan.spectral_gap == pytest.approx(_dense_gap(mask), abs=1e-9)
        assert (plan.spectral_gap > 1e-9) == plan.connected


def test_worker_parts_match_scipy_components():
    """Union-find parts (labelled by lowest rank) against scipy's connected components of the
    bipartite graph, on sparse random masks of every shape (tall, wide, empty rows/columns)."""
    from scipy.sparse import bmat, csr_matrix
    from scipy.sparse.csgraph import connected_components

    from slimpar.sdp.graph import worker_parts

    rng = np.random.default_rng(3)
    for _ in range(60):
        n, k = rng.integers(1, 40, 2)
        mask = (rng.random((n, k)) < rng.uniform(0.01, 0.3)).astype(np.uint8)
        _, labels = connected_components(bmat([[None, csr_matrix(mask)], [csr_matrix(mask.T), None]]))
        first = {}
        expected = [first.setdefault(lab, i) for i, lab in enumerate(labels[:n])]
        assert worker_parts(mask) == expected


def test_disconnected_mask_has_zero_gap_and_connected_positive():
    split = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]])
    plan = plan_components(_comps([1] * 4), 0, 4, assignment="explicit", mask=split)
    assert not plan.connected and plan.spectral_gap == 0.0 and _dense_gap(split) == pytest.approx(0, abs=1e-9)
    assert plan.report()["warnings"]
    chain = split.copy()
    chain[1, 2] = 1
    linked = plan_components(_comps([1] * 4), 0, 4, assignment="explicit", mask=chain)
    assert linked.connected and linked.spectral_gap > 0


def test_masking_error_by_hand():
    mask = np.array([[1, 1, 0], [0, 1, 1]])  # k = (1, 2, 1), N = 2
    assert masking_error(mask) == pytest.approx(((1 - 0.5) + (0.5 - 0.5) + (1 - 0.5)) / 3)
    # W = D_w^-1 M D_c^-1 M^T = [[3/4, 1/4], [1/4, 3/4]] -> lambda_2 = 1/2
    np.testing.assert_allclose(averaging_operator(mask), [[0.75, 0.25], [0.25, 0.75]])
    assert spectral_gap(mask) == pytest.approx(0.5)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_keep_one_is_ddp(n):
    plan = plan_components(_comps([3, 5, 7, 11]), 10, n, 1.0)
    assert plan.mask.all() and plan.masking_error == 0
    assert plan.spectral_gap == pytest.approx(1.0) and _dense_gap(plan.mask) == pytest.approx(1.0)
    assert plan.distinct_holder_sets == [tuple(range(n))]


# ----- cyclic -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,k,keep", [(4, 8, 0.5), (8, 16, 0.69), (5, 12, 0.3), (3, 4, 0.75), (8, 4, 0.5),
                                      (6, 10, 0.45)])
def test_cyclic_uniform_blocks_balanced_and_connected(n, k, keep):
    plan = plan_components(_comps([7] * k), 0, n, keep)
    kc = np.array(plan.holders_per_component)
    assert set(kc) <= {int(np.floor(keep * n)), int(np.ceil(keep * n))}
    held = plan.mask.sum(1)
    assert held.max() - held.min() <= 1 and abs(held.mean() - keep * k) <= 1
    assert plan.connected and len(plan.distinct_holder_sets) <= 2 * n  # runs of floor/ceil(CN) workers
    for hs in plan.distinct_holder_sets:  # every holder set is a cyclic run of consecutive ranks
        assert sum((r + 1) % n not in hs for r in hs) == (len(hs) < n)


def test_cyclic_balances_bytes_of_unequal_components():
    sizes = [10, 80, 20, 5, 60, 40, 30, 15, 70, 25, 50, 35]
    for keep in (0.3, 0.5, 0.7):
        plan = plan_components(_comps(sizes), 0, 6, keep)
        held = plan.mask @ np.array(sizes) * 4
        assert np.all(np.abs(held - keep * 4 * sum(sizes)) <= 4 * max(sizes)), (keep, held)
        assert min(plan.holders_per_component) >= 1


def test_cyclic_heterogeneous_keep_respected():
    sizes = [10] * 12
    for keep in ([1.0, 0.5, 0.5], [0.25, 0.5, 0.75, 1.0], [0.9, 0.1, 0.4, 0.6]):
        plan = plan_components(_comps(sizes), 0, len(keep), keep, min_holders=1)
        assert min(plan.holders_per_component) >= 1
        np.testing.assert_allclose(plan.keep_per_worker, keep, atol=1 / 12 + 1e-9)
    two = plan_components(_comps(sizes), 0, 3, [1.0, 0.5, 0.5], min_holders=2)
    assert min(two.holders_per_component) >= 2 and two.keep_per_worker == [1.0, 0.5, 0.5]


def test_cyclic_dominant_component_still_connected():
    plan = plan_components(_comps([3, 3, 12, 48, 190]), 0, 4, 0.5)
    assert plan.connected and min(plan.holders_per_component) >= 1


# ----- random -------------------------------------------------------------------------------------

def test_random_coverage_and_determinism():
    comps = _comps(list(np.random.default_rng(0).integers(5, 50, 16)))
    for seed in range(40):
        for mh, keep in ((1, 0.3), (2, 0.5), (3, 0.4)):
            plan = plan_components(comps, 0, 8, keep, min_holders=mh, assignment="random", seed=seed)
            assert min(plan.holders_per_component) >= mh and plan.mask.sum(1).min() >= 1
    a = plan_components(comps, 0, 8, 0.5, assignment="random", seed=3)
    b = plan_components(comps, 0, 8, 0.5, assignment="random", seed=3)
    c = plan_components(comps, 0, 8, 0.5, assignment="random", seed=4)
    assert np.array_equal(a.mask, b.mask) and not np.array_equal(a.mask, c.mask)


def test_random_uniform_balanced():
    plan = plan_components(_comps([5] * 16), 0, 8, 0.69, assignment="random", seed=11)
    assert set(plan.holders_per_component) <= {5, 6}
    held = plan.mask.sum(1)
    assert held.max() - held.min() <= 1


def test_random_heterogeneous_keep():
    keep = [1.0, 0.25, 0.5, 0.75]
    plan = plan_components(_comps([4] * 16), 0, 4, keep, assignment="random", seed=5)
    np.testing.assert_allclose(plan.keep_per_worker, keep, atol=1 / 16 + 1e-9)


@pytest.mark.parametrize("assignment", ["cyclic", "random"])
def test_min_holders_two(assignment):
    plan = plan_components(_comps([9, 1, 4, 4, 7, 2, 8, 3]), 0, 5, 0.4, min_holders=2, assignment=assignment)
    assert min(plan.holders_per_component) >= 2


# ----- errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,match", [
    (dict(world_size=4, keep=0.0), r"\(0, 1\]"),
    (dict(world_size=4, keep=1.5), r"\(0, 1\]"),
    (dict(world_size=4, keep=[0.5, 0.5]), "2 entries but world_size is 4"),
    (dict(world_size=2, keep=1.0, min_holders=3), "exceeds world_size"),
    (dict(world_size=4, keep=0.25, min_holders=2), "coverage unreachable"),
    (dict(world_size=1, keep=0.5), "never be trained"),
    (dict(world_size=2, keep=None, assignment="explicit", mask=np.ones((3, 4))), r"shape \(3, 4\)"),
    (dict(world_size=2, keep=None, assignment="explicit", mask=np.full((2, 4), 2)), "only 0/1"),
    (dict(world_size=2, keep=None, assignment="explicit", mask=np.array([[1, 1, 0, 1], [1, 0, 0, 1]])),
     r"\['c2'\] are held by fewer than min_holders=1"),
    (dict(world_size=2, keep=None, assignment="explicit", mask=np.ones((2, 4)), min_holders=3),
     "exceeds world_size"),
    (dict(world_size=2, keep=0.5, assignment="greedy"), "unknown assignment"),
])
def test_bad_plans_raise(kw, match):
    with pytest.raises(PlanError, match=match):
        plan_components(_comps([1, 2, 3, 4]), 0, **kw)


def test_too_many_neuron_groups(tiny):
    with pytest.raises(PlanError, match="only 176 hidden units"):
        plan_neurons(tiny, 2, 0.5, groups=177)


def test_load_mask_file(tmp_path):
    text = tmp_path / "m.txt"
    text.write_text("# two workers\n1, 1, 0\n\n0 1 1\n")
    mask = load_mask_file(text)
    np.testing.assert_array_equal(mask, [[1, 1, 0], [0, 1, 1]])
    np.save(tmp_path / "m.npy", mask)
    np.testing.assert_array_equal(load_mask_file(tmp_path / "m.npy"), mask)
    plan = plan_components(_comps([1, 1, 1]), 0, 2, assignment="explicit", mask=mask)
    assert plan.holders("c1") == (0, 1) and plan.distinct_holder_sets == [(0,), (0, 1), (1,)]
    (tmp_path / "bad.txt").write_text("1 2\n0 1\n")
    with pytest.raises(PlanError, match="0/1"):
        load_mask_file(tmp_path / "bad.txt")


# ----- components from models --------------------------------------------------------------------

def _total_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # de-duplicated (tied once)


@pytest.mark.parametrize("tie", [True, False])
def test_llama_components_account_for_every_byte(tie):
    model = Llama(LlamaConfig.tiny(vocab_size=256, tie_embeddings=tie))
    cfg = model.cfg
    for level in ("block", "neuron"):
        comps, shared, shared_bytes = llama_components(model, level, groups=5)
        assert shared_bytes + sum(c.param_bytes for c in comps) == _total_bytes(model)
        owned = {p for c in comps for p in c.params}
        assert not owned & set(shared) and ("output.weight" in shared) != tie
    comps, _, _ = llama_components(model, "neuron", groups=5)
    assert len(comps) == 5 * cfg.n_layers
    layer0 = [c for c in comps if c.layer == "layers.0"]
    assert sum(c.index[1] - c.index[0] for c in layer0) == cfg.ffn_dim
    assert [c.index[1] - c.index[0] for c in layer0] == [36, 35, 35, 35, 35]
    assert layer0[0].param_bytes == 36 * 3 * cfg.dim * 4 and layer0[0].dims == (0, 0, 1)


def test_plan_blocks_and_neurons_on_llama(tiny):
    plan = plan_blocks(tiny, 4, 0.5)
    assert [c.name for c in plan.components] == [f"layers.{i}" for i in range(4)]
    assert plan.holders_per_component == [2, 2, 2, 2] and plan.connected
    report = json.loads(json.dumps(plan.report()))
    for key in ("mask", "holders_per_component", "keep_per_worker", "bytes_per_worker", "connected",
                "spectral_gap", "masking_error", "components", "distinct_holder_sets", "world_size",
                "assignment"):
        assert key in report
    assert plan.bytes_per_worker[0] == plan.shared_bytes + 2 * plan.components[0].param_bytes
    assert "layers.3" in plan.table()
    neurons = plan_neurons(tiny, 4, 0.5, groups=4, assignment="random", seed=1)
    assert len(neurons.components) == 16 and min(neurons.holders_per_component) >= 1


def test_analytic_bytes_by_hand():
    comps = _comps([25, 50, 75])  # 100, 200, 300 bytes
    mask = np.array([[1, 1, 0], [1, 0, 1], [0, 0, 1]])  # k = (2, 1, 2)
    plan = plan_components(comps, 40, 3, assignment="explicit", mask=mask, shared_numel=10)
    r0 = analytic_bytes_per_step(plan, 0)
    assert r0["components"] == 100 and r0["shared"] == 40 and r0["total"] == 140  # c1 (k=1) never sent
    assert r0["per_holder_set"] == {(0, 1): 100} and r0["ddp"] == (10 + 150) * 4
    assert r0["ring_wire"] == pytest.approx(2 * 1 / 2 * 100 + 2 * 2 / 3 * 40)
    r1 = analytic_bytes_per_step(plan, 1, elem_bytes=2)
    assert r1["per_holder_set"] == {(0, 1): 50, (1, 2): 150} and r1["total"] == 50 + 150 + 20
    single = plan_components(comps, 40, 1, 1.0, shared_numel=10)
    assert analytic_bytes_per_step(single, 0)["total"] == 0


# ----- ResNet / Swin stand-ins (duck-typed: blocks ModuleDict with `maskable`) -------------------

class _Basic(nn.Module):
    def __init__(self, c_in: int, c: int, maskable: bool = True):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c_in, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c_in, 3, padding=1, bias=False), nn.BatchNorm2d(c_in)
        self.maskable = maskable

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))


class _TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.blocks = nn.ModuleDict({"0": _Basic(4, 6), "1": _Basic(4, 8, False), "2": _Basic(4, 10)})
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for b in self.blocks.values():
            h = b(h)
        return self.head(h.mean((2, 3)))


def test_resnet_standin_components():
    model = _TinyResNet()
    comps, shared, shared_bytes = resnet_components(model, "block")
    assert [c.name for c in comps] == ["blocks.0", "blocks.2"] and "blocks.1.conv1.weight" in shared
    assert shared_bytes + sum(c.param_bytes for c in comps) == _total_bytes(model)
    comps, shared, shared_bytes = resnet_components(model, "neuron", groups=3, input_shape=(1, 3, 5, 5))
    assert shared_bytes + sum(c.param_bytes for c in comps) == _total_bytes(model)
    g0 = comps[0]  # block 0, channels [0, 2): conv1 2x4x3x3, bn1 2+2, conv2 4x2x3x3
    assert g0.index == (0, 2) and g0.param_bytes == 4 * (72 + 4 + 72)
    assert g0.flops == 2 * (72 + 72) * 25  # per 5x5 image
    assert g0.buffers == ("blocks.0.bn1.running_mean", "blocks.0.bn1.running_var")
    assert "blocks.0.bn2.weight" in shared and model.training


def test_swin_standin_components():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fc1, self.fc2 = nn.LayerNorm(4), nn.Linear(4, 8), nn.Linear(8, 4)
            self.maskable = True

    model = nn.Module()
    model.patch = nn.Linear(12, 4)
    model.blocks = nn.ModuleDict({str(i): Block() for i in range(3)})
    comps, shared, shared_bytes = swin_components(model)
    assert len(comps) == 3 and shared == ["patch.weight", "patch.bias"]
    assert comps[0].flops == 2 * (32 + 32)
    assert shared_bytes + sum(c.param_bytes for c in comps) == _total_bytes(model)
    plan = plan_blocks(model, 3, 2 / 3)
    assert plan.holders_per_component == [2, 2, 2] and plan.connected
