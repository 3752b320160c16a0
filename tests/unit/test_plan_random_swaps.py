"""Random SDP assignment keeps the keep budget: a disconnected placement is joined by
degree-preserving swaps, never by extra holders unless no connected plan with those counts exists.

The placement's counts (each worker's held count r_i, each component's k_c) are the budget. A
connected 0/1 mask with those margins exists iff every r_i >= 1, every k_c >= 1 and
sum r_i >= N + K - 1 (a connected graph on N + K nodes needs N + K - 1 edges; conversely while the
graph is disconnected with that many edges some part has a cycle, and a swap across parts merges
two parts: the argument of ``connect_by_swaps``). ``test_connected_realisation_criterion`` checks
that criterion against brute force on every small mask.
"""

from fractions import Fraction
from itertools import product

import numpy as np
import pytest

from slimpar.sdp.assign import random_mask
from slimpar.sdp.components import Component
from slimpar.sdp.graph import mask_connected
from slimpar.sdp.plan import PlanError, plan_components


def _comps(sizes) -> list[Component]:
    return [Component(f"c{i}", param_bytes=4 * int(s), flops=2 * int(s), params=(f"p{i}",), numel=int(s))
            for i, s in enumerate(sizes)]


def _feasible(rows: np.ndarray, cols: np.ndarray) -> bool:
    """A connected mask with these margins exists (given that some mask with them exists)."""
    return bool(rows.min() >= 1 and cols.min() >= 1 and rows.sum() >= len(rows) + len(cols) - 1)


def _cases(count: int, seed: int = 2026):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n, k = int(rng.integers(2, 65)), int(rng.integers(2, 65))
        keep = float(rng.choice([0.125, 0.25, 1 / 3, 0.5, 0.69, 0.75, float(rng.uniform(0.05, 1.0))]))
        min_holders = min(n, int(rng.choice([1, 1, 1, 2, 3])))
        if keep * n < min_holders + 0.01:  # coverage unreachable: the planner rejects it (tested elsewhere)
            keep = min(1.0, (min_holders + 0.25) / n)
        equal = bool(rng.random() < 0.5)
        sizes = [16] * k if equal else rng.integers(1, 100, k).tolist()
        yield n, k, keep, min_holders, equal, sizes, int(rng.integers(0, 2**31))


def test_random_assignment_keeps_budget_and_connects():
    stats = {"feasible": 0, "infeasible": 0, "swapped": 0}
    for n, k, keep, mh, equal, sizes, seed in _cases(1000):
        comps = _comps(sizes)
        plan = plan_components(comps, 0, n, keep, min_holders=mh, assignment="random", seed=seed)
        raw = random_mask([Fraction(c.param_bytes) for c in comps], [Fraction(keep)] * n, mh, seed)
        rows, cols, raw_rows, raw_cols = plan.mask.sum(1), plan.mask.sum(0), raw.sum(1), raw.sum(0)
        case = (n, k, keep, mh, equal, seed)
        assert cols.min() >= mh, case
        assert plan.connected, case  # always: with added links where the counts cannot be connected
        if _feasible(raw_rows, raw_cols):
            stats["feasible"] += 1
            stats["swapped"] += not np.array_equal(plan.mask, raw)
            assert np.array_equal(rows, raw_rows) and np.array_equal(cols, raw_cols), case
            if equal:  # equal blocks: the budget is floor or ceil of the slots per worker
                assert rows.max() - rows.min() <= 1 and abs(rows.mean() - keep * k) <= 1, case
        else:  # only the links a connected graph cannot do without are added
            stats["infeasible"] += 1
            added = int(plan.mask.sum() - raw.sum())
            assert (rows >= raw_rows).all() and (cols >= raw_cols).all(), case
            assert added == max(n + k - 1 - raw.sum(), (raw_rows == 0).sum()), case
        again = plan_components(comps, 0, n, keep, min_holders=mh, assignment="random", seed=seed)
        assert np.array_equal(plan.mask, again.mask), case
    assert stats["feasible"] > 500 and stats["swapped"] > 10 and stats["infeasible"] > 5, stats


def test_four_blocks_on_four_workers_never_exceed_half():
    comps = _comps([100] * 4)
    for seed in range(200):
        plan = plan_components(comps, 0, 4, 0.5, assignment="random", seed=seed)
        assert plan.connected and plan.mask.sum(1).tolist() == [2] * 4 and plan.holders_per_component == [2] * 4


@pytest.mark.parametrize("n,k", [(2, 2), (2, 3), (3, 3), (2, 5), (3, 4)])
def test_connected_realisation_criterion(n, k):
    """Brute force over every n x k 0/1 mask: margins admit a connected mask iff _feasible."""
    connected_margins, all_margins = set(), set()
    for bits in product((0, 1), repeat=n * k):
        m = np.array(bits, dtype=np.uint8).reshape(n, k)
        key = (tuple(m.sum(1)), tuple(m.sum(0)))
        all_margins.add(key)
        if key not in connected_margins and m.sum(1).min() > 0 and m.sum(0).min() > 0 and mask_connected(m):
            connected_margins.add(key)
    for rows, cols in all_margins:
        assert ((rows, cols) in connected_margins) == _feasible(np.array(rows), np.array(cols)), (rows, cols)


def test_holder_sets_bound_the_process_groups():
    rng = np.random.default_rng(5)
    for _ in range(60):
        n, k, g = int(rng.integers(2, 129)), int(rng.integers(2, 129)), int(rng.integers(1, 33))
        keep = float(rng.choice([0.25, 0.5, 0.75]))
        if keep * n < 1.01:
            keep = 1.0
        seed = int(rng.integers(0, 1000))
        plan = plan_components(_comps([16] * k), 0, n, keep, assignment="random", seed=seed, holder_sets=g)
        case = (n, k, g, keep, seed)
        assert len(plan.distinct_holder_sets) <= min(g, k) and plan.connected, case
        assert min(plan.holders_per_component) >= 1, case
        again = plan_components(_comps([16] * k), 0, n, keep, assignment="random", seed=seed, holder_sets=g)
        assert np.array_equal(plan.mask, again.mask), case
        if g >= k:
            plain = plan_components(_comps([16] * k), 0, n, keep, assignment="random", seed=seed)
            assert np.array_equal(plan.mask, plain.mask), case
    big = plan_components(_comps([16] * 128), 0, 1024, 0.5, assignment="random", seed=1, holder_sets=16)
    assert len(big.distinct_holder_sets) == 16 and big.mask.sum(1).tolist() == [64] * 1024
    with pytest.raises(PlanError, match="holder_sets"):
        plan_components(_comps([16] * 8), 0, 4, 0.5, holder_sets=4)
