"""Building cyclic and random SDP masks, and joining a disconnected mask graph (the rules are in
``plan.py``'s module docstring). Pure: exact fractions and seeded generators only."""

from __future__ import annotations

from bisect import bisect_left
from fractions import Fraction
from itertools import accumulate

import numpy as np

from slimpar.sdp.graph import bridge, mask_connected, part_edges, worker_parts

__all__ = ["arc_mask", "bundles", "connect_by_adding", "connect_by_swaps", "cyclic_mask", "random_mask"]


def arc_mask(w: list[Fraction], keep: list[Fraction], stretch: Fraction) -> np.ndarray:
    """Worker i holds the components whose arc midpoints lie in [a_i, a_i + C_i W) on the circle
    of circumference W, with a_i = W (C_0 + .. + C_{i-1}) * stretch; an arc that holds no midpoint
    takes the component under its centre."""
    total = sum(w)
    ends = list(accumulate(w))
    mids = [e - x / 2 for e, x in zip(ends, w, strict=True)]  # nondecreasing, in [0, total]
    mask = np.zeros((len(keep), len(w)), dtype=np.uint8)
    start = Fraction(0)
    for i, c_i in enumerate(keep):
        a, length = total * start * stretch, c_i * total
        if length >= total:
            mask[i] = 1
        else:  # (m - a) % total < length  <=>  m in [lo, lo + length) or m in [0, lo + length - total)
            lo = a % total
            mask[i, bisect_left(mids, lo):bisect_left(mids, lo + length)] = 1
            mask[i, :bisect_left(mids, lo + length - total)] = 1
            for c in range(len(mids) - 1, -1, -1):  # zero-weight last components: midpoint total, i.e. 0
                if mids[c] != total:
                    break
                mask[i, c] = (mids[c] - a) % total < length
        if not mask[i].any():
            centre = (a + length / 2) % total
            mask[i, next(c for c, e in enumerate(ends) if centre < e)] = 1
        start += c_i
    return mask


def connect_by_adding(mask: np.ndarray, w: list[Fraction]) -> np.ndarray:
    """Join the graph's parts: while disconnected, add the cheapest cross link, the (worker i,
    component c) pair with i outside c's part minimising (w_c, cyclic index distance from c to i's
    held components, load_i, i, c), which extends a run where it can. In place."""
    n, k = mask.shape
    wf, idx = np.array([float(x) for x in w]), np.arange(k)
    gap = np.minimum(np.abs(idx[:, None] - idx), k - np.abs(idx[:, None] - idx))  # (K, K)
    while not mask_connected(mask):
        part = np.array(worker_parts(mask))
        ii, cc = np.nonzero(part[:, None] != part[mask.argmax(0)][None, :])  # i outside c's part
        dist = np.where(mask[:, None, :] > 0, gap[None], k).min(2)  # (N, K)
        best = np.lexsort((cc, ii, (mask @ wf)[ii], dist[ii, cc], wf[cc]))[0]
        mask[ii[best], cc[best]] = 1
    return mask


def connect_by_swaps(mask: np.ndarray, w: list[Fraction], seed: int) -> np.ndarray:
    """Merge the graph's parts by degree-preserving swaps while a part with a cycle (edges >= nodes)
    and another part with an edge exist: an edge (i, c) on a cycle of part A (not a bridge) and an
    edge (j, d) of part B become (i, d) and (j, c). A stays connected without (i, c), each piece of
    B without (j, d) is joined to A, so the parts drop by one and no count changes. The pair (c, d)
    minimises |w_c - w_d| (byte balance), ties and the choice of i and j are broken by a seeded
    generator (its own stream: connected placements are untouched). In place."""
    rng, wf = np.random.default_rng([seed, 0x5EED]), np.array([float(x) for x in w])
    while len(set(parts := worker_parts(mask))) > 1:
        edges, nodes, comp_part = part_edges(mask, parts)
        cyclic = sorted((p for p in edges if edges[p] >= nodes[p]), key=lambda p: (nodes[p] - edges[p], p))
        if not cyclic or not (others := sorted(p for p in edges if edges[p] and p != cyclic[0])):
            return mask  # no connected graph with these counts: connect_by_adding adds the rest
        a, b, k_c, rows = cyclic[0], others[0], mask.sum(0), mask.sum(1)
        cs = np.flatnonzero((comp_part == a) & (k_c >= 2))
        ds = np.flatnonzero(comp_part == b)
        cost = np.abs(wf[cs][:, None] - wf[ds][None, :]).ravel()
        on_cycle: dict[int, int | None] = {}  # c -> a holder i whose edge (i, c) is not a bridge
        for pair in np.lexsort((rng.random(cost.size), cost)):
            c, d = int(cs[pair // len(ds)]), int(ds[pair % len(ds)])
            if c not in on_cycle:
                holders = rng.permutation(np.flatnonzero((mask[:, c] > 0) & (rows >= 2))).tolist()
                on_cycle[c] = next((i for i in holders if not bridge(mask, i, c)), None)
            if on_cycle[c] is not None:
                i, j = on_cycle[c], int(rng.choice(np.flatnonzero(mask[:, d])))
                mask[i, c] = mask[j, d] = 0
                mask[i, d] = mask[j, c] = 1
                break
    return mask


def cyclic_mask(w: list[Fraction], keep: list[Fraction], min_holders: int) -> np.ndarray:
    """Staggered layout (stretch 1/S) unless it misses coverage or connectivity; then the wrapped
    layout (stretch 1), which always covers every component floor(S) >= min_holders times."""
    staggered, wrapped = arc_mask(w, keep, 1 / sum(keep)), arc_mask(w, keep, Fraction(1))
    candidates = [m for m in (staggered, wrapped) if m.sum(0).min() >= min_holders]
    connected = [m for m in candidates if mask_connected(m)]
    return connected[0] if connected else connect_by_adding(candidates[0], w)


def random_mask(w: list[Fraction], keep: list[Fraction], min_holders: int, seed: int) -> np.ndarray:
    """Balanced random with a coverage guarantee; see the module docstring."""
    rng = np.random.default_rng(seed)
    n, k, s = len(keep), len(w), sum(keep)
    wf = np.array([float(x) for x in w])
    base, frac = int(s), float(s - int(s))
    k_c = np.full(k, base)
    acc = 0.0
    for c in rng.permutation(k):  # one extra holder for ~frac of the weight (midpoint rule)
        if acc + wf[c] / 2 <= frac * wf.sum():
            k_c[c] += 1
        acc += wf[c]
    k_c = np.clip(np.maximum(k_c, min_holders), 1, n)
    target = np.array([float(c) for c in keep]) * wf.sum()
    load, keys, mask = np.zeros(n), rng.random((k, n)), np.zeros((n, k), dtype=np.uint8)
    for c in np.lexsort((rng.random(k), -wf)):  # heaviest first, random tie-break
        pick = np.lexsort((keys[c], -(target - load)))[: k_c[c]]
        mask[pick, c] = 1
        load[pick] += wf[c]
    return mask


def bundles(w: list[Fraction], count: int, seed: int) -> list[list[int]]:
    """The components in ``count`` bundles of nearly equal weight (longest processing time first:
    heaviest first, seeded tie-break, each onto the lightest bundle, lowest index on ties)."""
    rng, wf = np.random.default_rng([seed, 0xB0D]), np.array([float(x) for x in w])
    load, out = np.zeros(count), [[] for _ in range(count)]
    for c in np.lexsort((rng.random(len(w)), -wf)).tolist():
        b = int(np.argmin(load))
        out[b].append(c)
        load[b] += wf[c]
    return [sorted(b) for b in out]
