"""Graph metrics of an SDP mask (docs/methods.md, 'Graph metrics'): connectivity, spectral gap, masking error.

Mask M (N workers x K components, 0/1). The worker-component graph is bipartite with an edge
(i, c) for every M_ic = 1; a worker without components is isolated.
- W = D_w^-1 M D_c^-1 M^T (row-stochastic); spectral gap rho = 1 - lambda_2(W) from the similar
  symmetric A A^T with A = D_w^-1/2 M D_c^-1/2. A A^T (N x N) and A^T A (K x K) share their nonzero
  eigenvalues, so the smaller Gram matrix is decomposed: O(N K min(N, K) + min(N, K)^3), not O(N^3);
- connectivity by union-find over the mask's nonzeros, O(N K), instead of powers of an N x N matrix.
"""

from __future__ import annotations

import numpy as np

__all__ = ["averaging_operator", "spectral_gap", "worker_parts", "mask_connected", "masking_error",
           "part_edges", "bridge"]


def averaging_operator(mask: np.ndarray) -> np.ndarray:
    """W = D_w^-1 M D_c^-1 M^T (N x N, row-stochastic) for a mask without empty rows or columns."""
    m = mask.astype(np.float64)
    return (m / m.sum(1, keepdims=True)) @ (m / m.sum(0, keepdims=True)).T


def spectral_gap(mask: np.ndarray) -> float:
    """rho = 1 - lambda_2(W), from eigvalsh of the smaller of A A^T and A^T A (same nonzero spectrum;
    the larger one's extra eigenvalues are zeros, so lambda_2 is 0 when the smaller one is 1 x 1)."""
    m = mask.astype(np.float64)
    if m.shape[0] == 1:
        return 1.0
    if not mask_connected(mask):
        return 0.0
    a = (m / np.sqrt(m.sum(1, keepdims=True))) / np.sqrt(m.sum(0, keepdims=True))  # (N, K)
    lam = np.linalg.eigvalsh(a.T @ a if a.shape[1] < a.shape[0] else a @ a.T)  # ascending, in [0, 1]
    return float(max(0.0, 1.0 - (lam[-2] if len(lam) > 1 else 0.0)))


def worker_parts(mask: np.ndarray) -> list[int]:
    """Each worker's part of the worker-component graph, labelled by its lowest rank (union-find
    over every component's holders; the root of a set is always its lowest rank)."""
    n = mask.shape[0]
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    cols, rows = np.nonzero(np.asarray(mask).T)  # holders of each component, component by component
    first = {}
    for c, r in zip(cols.tolist(), rows.tolist(), strict=True):
        if c not in first:
            first[c] = r
            continue
        a, b = find(first[c]), find(r)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return [find(i) for i in range(n)]


def mask_connected(mask: np.ndarray) -> bool:
    """True iff all N workers are linked through commonly held components (a worker without
    components is isolated)."""
    return len(set(worker_parts(mask))) == 1


def masking_error(mask: np.ndarray) -> float:
    """sum_c (1/k_c - 1/N) / K: 0 for DDP (all ones), larger for sparser holder sets."""
    k = mask.sum(0).astype(np.float64)
    return float(np.mean(1.0 / k - 1.0 / mask.shape[0]))


def part_edges(mask: np.ndarray, parts: list[int]) -> tuple[dict[int, int], dict[int, int], np.ndarray]:
    """Per part label: edges and nodes (workers + components held in it); and each component's part
    (-1 for a component nobody holds). A part has a cycle iff edges >= nodes."""
    lab = np.asarray(parts)
    comp_part = np.where(mask.sum(0) > 0, lab[np.asarray(mask).argmax(0)], -1)
    edges, nodes = {}, {}
    for p in set(parts):
        edges[p] = int(mask[lab == p].sum())
        nodes[p] = int((lab == p).sum() + (comp_part == p).sum())
    return edges, nodes, comp_part


def bridge(mask: np.ndarray, i: int, c: int) -> bool:
    """True iff edge (worker i, component c) is a bridge: without it, i and c are disconnected."""
    m = np.asarray(mask, dtype=bool).copy()
    m[i, c] = False
    seen_w, seen_c, frontier = np.zeros(m.shape[0], bool), np.zeros(m.shape[1], bool), np.zeros(m.shape[1], bool)
    frontier[c] = seen_c[c] = True
    while frontier.any():
        w = m[:, frontier].any(1) & ~seen_w
        if w[i]:
            return False
        seen_w |= w
        frontier = m[w].any(0) & ~seen_c
        seen_c |= frontier
    return True
