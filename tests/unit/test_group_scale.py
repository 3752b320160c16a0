"""SDP's refresh roots at scale: the exact greedy search of ``sdp/roots.py``, vectorized, equals the
candidate-by-candidate search it replaced."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from slimpar.bench.plan_sim import synthetic_components
from slimpar.parallel.comm import binomial_broadcast, ring_allreduce
from slimpar.sdp import roots
from slimpar.sdp.plan import analytic_bytes_per_step, plan_components


def _roots_one_candidate_at_a_time(plan) -> dict[int, int]:
    """The greedy search of ``sdp.roots`` as first written: every candidate root's broadcast tree and the
    group's loads built afresh, in Fractions (11 s at 1,024 workers for 8 blocks)."""
    n = plan.world_size
    load = []
    for r in range(n):
        a = analytic_bytes_per_step(plan, r, elem_bytes=None)
        load.append(sum(ring_allreduce(b, len(hs)) for hs, b in a["per_holder_set"].items())
                    + ring_allreduce(a["shared"], n))
    out = {}
    stale = [c for c in range(len(plan.components)) if len(plan.holders(c)) < n]
    for c in sorted(stale, key=lambda c: (-plan.components[c].param_bytes, c)):
        size, best = plan.components[c].param_bytes, None
        for root in plan.holders(c):
            members = roots.refresh_members(plan, c, root)
            tree = binomial_broadcast(len(members), members.index(root))
            new = {w: load[w] + Fraction(size * s) for w, (s, _) in zip(members, tree, strict=True)}
            if best is None or (max(new.values()), new[root], root) < best[0]:
                best = ((max(new.values()), new[root], root), root, new)
        out[c] = best[1]
        load = [best[2].get(w, v) for w, v in enumerate(load)]
    return dict(sorted(out.items()))


def _uneven(k: int, scale: int = 1):
    return [dataclasses.replace(c, param_bytes=4 * (1000 + 37 * (i % 5)) * scale) for i, c in
            enumerate(synthetic_components(k, 1000))]


@pytest.mark.parametrize("scale", [1, 2**48])  # 2**48: past int64, so the search runs on Python integers
def test_refresh_roots_equal_the_candidate_by_candidate_search(scale):
    for n, k, keep, assignment in [(2, 3, 0.5, "cyclic"), (5, 8, 0.3, "cyclic"), (8, 17, 0.75, "random"),
                                   (13, 8, 0.5, "random"), (32, 17, 0.3, "cyclic"), (64, 8, 0.5, "random")]:
        plan = plan_components(_uneven(k, scale), 12345, n, keep, assignment=assignment, seed=n + k)
        assert roots.refresh_roots(plan) == _roots_one_candidate_at_a_time(plan), (n, k, keep, assignment)


@pytest.mark.parametrize("k", [1, 2, 3, 7, 8, 9, 33, 64])
def test_sends_by_virtual_rank_are_the_binomial_tree(k):
    assert roots._sends_by_vrank(k).tolist() == [s for s, _ in binomial_broadcast(k, 0)]
