"""Backward regime: which holder broadcasts each stale component in the refresh (a pure function of the plan).

Every component that not all workers hold is broadcast after each optimizer step from one of its holders
to the workers that do not hold it (``SubnetworkDataParallel.refresh``). The holders' copies are
bit-identical, so any holder gives the same result; the choice only decides who sends. Taking the first
holder every time makes the lowest ranks send the most (rank 0 sent as much as under DDP for Bb-SDP 0.5).

:func:`refresh_roots` spreads the roots greedily: components in decreasing size (plan order on ties), each
given to the holder that leaves the largest per-rank send of its broadcast group smallest, counting
every rank's gradient all-reduces first (ring model) and the broadcast as gloo's binomial tree (the root
sends ceil(log2 k) copies, inner nodes forward). Every rank computes the same roots from the same plan.
"""

from __future__ import annotations

from fractions import Fraction

from slimpar.parallel.comm import binomial_broadcast, ring_allreduce
from slimpar.sdp.plan import Plan, analytic_bytes_per_step


def refresh_members(plan: Plan, c: int, root: int) -> tuple[int, ...]:
    """The workers of component c's refresh broadcast: the root and every non-holder, sorted."""
    return tuple(sorted({root} | set(range(plan.world_size)) - set(plan.holders(c))))


def refresh_roots(plan: Plan) -> dict[int, int]:
    """Component -> the holder that broadcasts it in the refresh, for every component some worker lacks."""
    n = plan.world_size
    stale = [c for c in range(len(plan.components)) if len(plan.holders(c)) < n]
    if not stale:
        return {}
    load = []
    for r in range(n):  # what each rank already sends per step: its holder-group and shared all-reduces
        a = analytic_bytes_per_step(plan, r, elem_bytes=None)
        load.append(sum(ring_allreduce(b, len(hs)) for hs, b in a["per_holder_set"].items())
                    + ring_allreduce(a["shared"], n))
    roots = {}
    for c in sorted(stale, key=lambda c: (-plan.components[c].param_bytes, c)):
        size, best = plan.components[c].param_bytes, None
        for root in plan.holders(c):
            members = refresh_members(plan, c, root)
            tree = binomial_broadcast(len(members), members.index(root))
            new = {w: load[w] + Fraction(size * sends) for w, (sends, _) in zip(members, tree, strict=True)}
            score = (max(new.values()), new[root], root)
            if best is None or score < best[0]:
                best = (score, root, new)
        _, root, new = best
        roots[c] = root
        for w, v in new.items():
            load[w] = v
    return dict(sorted(roots.items()))
