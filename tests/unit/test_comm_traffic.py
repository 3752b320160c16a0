"""The per-rank traffic model of ``parallel/comm.py`` and the spread refresh roots of ``sdp/roots.py``
(no processes: the plans of the tiny and small LLaMA for 4 workers)."""

from __future__ import annotations

from fractions import Fraction

import pytest

import slimpar
from slimpar.models.llama import Llama, LlamaConfig
from slimpar.parallel.comm import binomial_broadcast, ring_allreduce, traffic
from slimpar.sdp.holders import refresh_sets
from slimpar.sdp.plan import analytic_bytes_per_step
from slimpar.sdp.roots import refresh_members, refresh_roots


@pytest.mark.parametrize("k", range(1, 10))
@pytest.mark.parametrize("root_at", [0, -1])
def test_binomial_broadcast_reaches_everyone_once(k, root_at):
    root = root_at % k
    tree = binomial_broadcast(k, root)
    assert sum(s for s, _ in tree) == k - 1  # k - 1 messages in all
    assert [r for _, r in tree] == [0 if i == root else 1 for i in range(k)]
    assert tree[root][0] == (k - 1).bit_length()  # the root sends ceil(log2 k) copies


def test_traffic_per_collective():
    n = 1200
    assert traffic("allreduce_", n, 4, 1) == (Fraction(1800), Fraction(1800)) == (ring_allreduce(n, 4),) * 2
    assert traffic("allreduce_", n, 1, 0) == (0, 0)
    assert traffic("broadcast_", n, 3, 0, root=0) == (2 * n, 0)
    assert traffic("broadcast_", n, 4, 2, root=1) == (n, n)  # virtual rank 1 forwards to virtual rank 3
    assert traffic("allgather_", n, 4, 0) == (3 * n, 3 * n)
    assert traffic("_reduce_scatter_base_", n, 4, 0) == (900, 900)
    assert traffic("send", n, 2, 0) == (n, 0) and traffic("recv_", n, 2, 1) == (0, n)


def _plan(size: str, keep: float):
    model = Llama(LlamaConfig.named(size, vocab_size=512))
    return slimpar.sdp.plan_blocks(model, world_size=4, keep=keep)


def _sent(plan, roots: dict[int, int]) -> list[Fraction]:
    """Per rank: ring all-reduces of the held gradients and the shared ones, plus the refresh broadcasts."""
    out = []
    for r in range(plan.world_size):
        a = analytic_bytes_per_step(plan, r, elem_bytes=None)
        out.append(sum(ring_allreduce(b, len(hs)) for hs, b in a["per_holder_set"].items())
                   + ring_allreduce(a["shared"], plan.world_size))
    for c, root in roots.items():
        members = refresh_members(plan, c, root)
        for w, (sends, _) in zip(members, binomial_broadcast(len(members), members.index(root)), strict=True):
            out[w] += sends * plan.components[c].param_bytes
    return out


@pytest.mark.parametrize("size", ["tiny", "small"])
@pytest.mark.parametrize("keep", [0.5, 0.375])
def test_refresh_roots_are_holders_and_no_rank_sends_more_than_ddp(size, keep):
    plan = _plan(size, keep)
    roots = refresh_roots(plan)
    assert roots == refresh_roots(plan)  # a pure function of the plan
    assert set(roots) == {c for c in range(len(plan.components)) if len(plan.holders(c)) < 4}
    for c, root in roots.items():
        assert root in plan.holders(c)
        members = refresh_sets(plan)[c]
        assert [w for w in members if plan.mask[w, c]] == [root]  # the broadcast's only holder is its root
    ddp = ring_allreduce(analytic_bytes_per_step(plan, 0, elem_bytes=None)["ddp"], 4)
    assert max(_sent(plan, roots)) <= ddp
    first = {c: plan.holders(c)[0] for c in roots}
    assert max(_sent(plan, roots)) <= max(_sent(plan, first))  # never worse than the first holder


def test_even_plan_spreads_refresh_evenly():
    """Bb-SDP 0.5 on 4 workers (every block on 2 workers): each rank broadcasts the same bytes."""
    sent = _sent(plan := _plan("small", 0.5), refresh_roots(plan))
    assert len(set(sent)) == 1
