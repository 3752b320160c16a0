"""Backward regime: which holder broadcasts each stale component in the refresh (a pure function of the plan).

Every component that not all workers hold is broadcast after each optimizer step from one of its holders
to the workers that do not hold it (``SubnetworkDataParallel.refresh``). The holders' copies are
bit-identical, so any holder gives the same result; the choice only decides who sends. Taking the first
holder every time makes the lowest ranks send the most (rank 0 sent as much as under DDP for Bb-SDP 0.5).

:func:`refresh_roots` spreads the roots greedily: components in decreasing size (plan order on ties), each
given to the holder that leaves the largest per-rank send of its broadcast group smallest, counting
every rank's gradient all-reduces first (ring model) and the broadcast as gloo's binomial tree (the root
sends ceil(log2 k) copies, inner nodes forward). Every rank computes the same roots from the same plan.

Cost: the sends are exact rationals (a ring all-reduce over k ranks sends 2 b (k - 1) / k), kept as integers
scaled by D = lcm(N, every k_c), so the search is exact integer arithmetic. For a component with h holders
and m non-holders a candidate root's broadcast group is the non-holders with the root inserted at its sorted
position p: group member q has virtual rank (q - p) mod (m + 1), so every candidate's sends are one rotation
of the non-holders' loads against the tree's sends by virtual rank, all candidates at once in numpy:
O(h m) element operations per component (int64; Python integers where D makes int64 too small). The
per-candidate Python loop it replaces took 11 s at N = 1,024 for 8 blocks; this takes milliseconds.
"""

from __future__ import annotations

from math import lcm

import numpy as np

from slimpar.sdp.plan import Plan

CHUNK = 1 << 22  # elements of one candidates x non-holders slab (32 MiB of int64) at a time


def refresh_members(plan: Plan, c: int, root: int) -> tuple[int, ...]:
    """The workers of component c's refresh broadcast: the root and every non-holder, sorted."""
    return tuple(sorted({root} | set(range(plan.world_size)) - set(plan.holders(c))))


def refresh_roots(plan: Plan) -> dict[int, int]:
    """Component -> the holder that broadcasts it in the refresh, for every component some worker lacks."""
    n, mask = plan.world_size, plan.mask.astype(bool)
    k = mask.sum(0)
    stale = [c for c in range(len(plan.components)) if k[c] < n]
    if not stale:
        return {}
    scale = lcm(n, *(int(x) for x in k if x > 1))  # every ring all-reduce's send is a multiple of 1 / scale
    load = _allreduce_loads(plan, mask, scale)
    sends = {m: _sends_by_vrank(m + 1) for m in {n - int(k[c]) for c in stale}}
    bound = max(load) + scale * sum(plan.components[c].param_bytes * int(sends[n - int(k[c])][0]) for c in stale)
    load = np.array(load, dtype=np.int64 if bound < 2**62 else object)  # exact either way
    roots = {}
    for c in sorted(stale, key=lambda c: (-plan.components[c].param_bytes, c)):
        holders, others = np.flatnonzero(mask[:, c]), np.flatnonzero(~mask[:, c])
        tree = sends[len(others)].astype(load.dtype) * (scale * plan.components[c].param_bytes)
        root, order = _best_root(load, holders, others, tree)
        load[root] += tree[0]
        load[order] += tree[1:]
        roots[c] = root
    return dict(sorted(roots.items()))


def _allreduce_loads(plan: Plan, mask: np.ndarray, scale: int) -> list[int]:
    """What each rank sends per step in its holder-group and shared all-reduces (ring model: 2 b (k - 1) / k
    per all-reduce of b bytes over k ranks), times ``scale``: exact Python integers."""
    n, k = plan.world_size, mask.sum(0)
    per_c = [2 * comp.param_bytes * (int(kc) - 1) * (scale // int(kc)) if kc > 1 else 0
             for comp, kc in zip(plan.components, k, strict=True)]
    shared = 2 * plan.shared_bytes * (n - 1) * (scale // n)
    return [shared + sum(per_c[c] for c in np.flatnonzero(row).tolist()) for row in mask]


def _sends_by_vrank(k: int) -> np.ndarray:
    """Copies sent by each virtual rank of gloo's binomial broadcast over k ranks
    (:func:`slimpar.parallel.comm.binomial_broadcast` with root 0): v sends to v + 2^i for every 2^i > v
    with v + 2^i < k."""
    v = np.arange(k)
    out = np.zeros(k, dtype=np.int64)
    for i in range((k - 1).bit_length()):
        out += (v < (1 << i)) & (v + (1 << i) < k)
    return out


def _best_root(load: np.ndarray, holders: np.ndarray, others: np.ndarray,
               tree: np.ndarray) -> tuple[int, np.ndarray]:
    """The holder whose broadcast leaves the group's largest load smallest (then its own, then the lowest
    rank), and the non-holders in virtual-rank order 1..m for it. A candidate at sorted position p (the
    non-holders below it) reaches non-holder (p + v - 1) mod m as virtual rank v."""
    m = len(others)
    pos = np.searchsorted(others, holders)  # each candidate's p
    distinct = np.unique(pos)
    worst = {}  # p -> the largest load among the non-holders after the broadcast
    rows = max(1, CHUNK // m)
    for lo in range(0, len(distinct), rows):
        ps = distinct[lo:lo + rows]
        idx = (ps[:, None] + np.arange(m)[None, :]) % m  # (candidates, m): non-holder at virtual rank 1..m
        worst.update(zip(ps.tolist(), (load[others[idx]] + tree[None, 1:]).max(1).tolist(), strict=True))
    scores = []
    for r, p in zip(holders.tolist(), pos.tolist(), strict=True):
        own = load[r] + tree[0]
        scores.append((max(own, worst[p]), own, r, p))
    _, _, root, p = min(scores)
    return root, others[(p + np.arange(m)) % m]
