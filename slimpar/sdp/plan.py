"""SDP planner: which worker holds which component (METHODS.md Part 1, sdp.md §1.2-1.4, §4.2).

Pure and deterministic in (seed, world size, model structure): every rank computes every rank's
mask without communicating, and a restart recomputes the same masks.

Mask M (N workers x K components, 0/1); holder set S_c = {i : M_ic = 1}, k_c = |S_c|. Graph metrics
use maskable components only (shared parameters, held by all, would connect every graph trivially):
- connected: the bipartite worker-component graph is connected (a worker without components is not);
- W = D_w^-1 M D_c^-1 M^T (row-stochastic); spectral gap rho = 1 - lambda_2(W) from the similar
  symmetric D_w^-1/2 M D_c^-1 M^T D_w^-1/2; rho > 0 iff connected; rho = 1 for N = 1;
- masking error = sum_c (1/k_c - 1/N) / K (excess gradient variance at unit sigma_c^2).

Assignment rules (``weights`` w_c are component bytes, FLOPs, counts or their normalised mean;
W = sum w_c; C_i the keep fraction of worker i; S = sum_i C_i):
- cyclic: components lie in model order on a circle of circumference W, component c occupying the
  arc [e_{c-1}, e_c) with midpoint m_c. Worker i gets the arc of length C_i W starting at
  a_i = W P_i / S (staggered; P_i = C_0 + .. + C_{i-1}) and holds every component whose midpoint
  falls in it (exact rational arithmetic); an arc without a midpoint takes the component under its
  centre. Uniform C: a_i = i W / N, so every k_c is floor(CN) or ceil(CN), held bytes are C W
  within one component, and neighbouring runs overlap when CN > 1. With heterogeneous C the
  staggered layout can miss coverage; then (or when it is disconnected) the wrapped layout
  a_i = W P_i (McNaughton's wrap-around) is used, which covers every point floor(S) times.
  If neither layout is connected, the covered one is joined up by ``_connect`` (cheapest links).
- random: k_c = floor(S) for every c, plus one for a seeded random subset of components whose
  weight sums to about (S - floor(S)) W; k_c is raised to min_holders. Components are placed
  heaviest first (random tie-break) on the k_c workers with the largest remaining deficit
  C_i W - load_i (random tie-break); a disconnected result (or an empty worker) is joined up by
  ``_connect``.
- explicit: a user mask, validated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import accumulate
from pathlib import Path

import numpy as np
from torch import nn

from slimpar.sdp.components import Component, PlanError, model_components

__all__ = ["Plan", "PlanError", "plan_components", "plan_blocks", "plan_neurons", "load_mask_file",
           "analytic_bytes_per_step", "averaging_operator", "spectral_gap", "mask_connected", "masking_error"]


def averaging_operator(mask: np.ndarray) -> np.ndarray:
    """W = D_w^-1 M D_c^-1 M^T (N x N, row-stochastic) for a mask without empty rows or columns."""
    m = mask.astype(np.float64)
    return (m / m.sum(1, keepdims=True)) @ (m / m.sum(0, keepdims=True)).T


def spectral_gap(mask: np.ndarray) -> float:
    """rho = 1 - lambda_2(W) via eigvalsh of the symmetric D_w^-1/2 M D_c^-1 M^T D_w^-1/2."""
    m = mask.astype(np.float64)
    if m.shape[0] == 1:
        return 1.0
    if not mask_connected(mask):
        return 0.0
    a = (m / np.sqrt(m.sum(1, keepdims=True))) / np.sqrt(m.sum(0, keepdims=True))  # (N, K)
    lam = np.linalg.eigvalsh(a @ a.T)  # ascending, all in [0, 1]
    return float(max(0.0, 1.0 - lam[-2]))


def worker_parts(mask: np.ndarray) -> list[int]:
    """Each worker's part of the worker-component graph, labelled by its lowest rank: transitive
    closure of "shares a component" (repeated squaring of the N x N reachability matrix)."""
    m = mask.astype(np.int64)
    reach = (m @ m.T > 0) | np.eye(len(m), dtype=bool)
    while not np.array_equal(nxt := (reach.astype(np.int64) @ reach) > 0, reach):
        reach = nxt
    return [int(np.argmax(row)) for row in reach]


def mask_connected(mask: np.ndarray) -> bool:
    """True iff all N workers are linked through commonly held components (a worker without
    components is isolated)."""
    return len(set(worker_parts(mask))) == 1


def masking_error(mask: np.ndarray) -> float:
    """sum_c (1/k_c - 1/N) / K: 0 for DDP (all ones), larger for sparser holder sets."""
    k = mask.sum(0).astype(np.float64)
    return float(np.mean(1.0 / k - 1.0 / mask.shape[0]))


@dataclass(eq=False)
class Plan:
    """Components, the N x K 0/1 mask and what it implies; see the module docstring."""

    components: list[Component]
    mask: np.ndarray  # (N, K) uint8
    shared_bytes: int
    seed: int
    assignment: str
    world_size: int
    shared_params: tuple[str, ...] = ()
    shared_numel: int | None = None  # None: shared_bytes // 4 (fp32 assumed)
    min_holders: int = 1
    balance: str = "bytes"

    def __post_init__(self) -> None:
        if self.mask.shape != (self.world_size, len(self.components)):
            raise PlanError(f"mask shape {self.mask.shape} != (world_size, components) "
                            f"= ({self.world_size}, {len(self.components)})")
        self.shared_numel = self.shared_bytes // 4 if self.shared_numel is None else self.shared_numel

    def holders(self, c: int | str | Component) -> tuple[int, ...]:
        """Sorted ranks holding component ``c`` (index, name or Component)."""
        c = c.name if isinstance(c, Component) else c
        col = [x.name for x in self.components].index(c) if isinstance(c, str) else int(c)
        return tuple(int(i) for i in np.flatnonzero(self.mask[:, col]))

    def held(self, rank: int) -> list[Component]:
        return [c for c, bit in zip(self.components, self.mask[rank], strict=True) if bit]

    @property
    def holders_per_component(self) -> list[int]:
        return [int(k) for k in self.mask.sum(0)]

    @property
    def keep_per_worker(self) -> list[float]:
        """C_i: fraction of components held."""
        return [float(r) for r in self.mask.sum(1) / self.mask.shape[1]]

    @property
    def keep_bytes_per_worker(self) -> list[float]:
        """Fraction of maskable parameter bytes held."""
        b = np.array([c.param_bytes for c in self.components], dtype=np.float64)
        return [float(x) for x in (self.mask @ b) / b.sum()]

    @property
    def bytes_per_worker(self) -> list[int]:
        """Parameter bytes resident on each worker: shared + held components."""
        return [self.shared_bytes + sum(c.param_bytes for c in self.held(r)) for r in range(self.world_size)]

    @property
    def distinct_holder_sets(self) -> list[tuple[int, ...]]:
        """Every distinct S_c, sorted lexicographically: the same order on every rank, so process
        groups can be created from it collectively. Singletons need no collective."""
        return sorted({self.holders(c) for c in range(len(self.components))})

    @property
    def connected(self) -> bool:
        return mask_connected(self.mask)

    @property
    def spectral_gap(self) -> float:
        return spectral_gap(self.mask)

    @property
    def masking_error(self) -> float:
        return masking_error(self.mask)

    def warnings(self) -> list[str]:
        return [] if self.connected else ["mask graph disconnected (spectral gap 0): some groups of "
                                          "workers never average any component together"]

    def report(self) -> dict:
        """JSON-ready summary: mask, k_c, C_i, bytes per rank, connectivity, rho, masking error."""
        return {
            "world_size": self.world_size, "assignment": self.assignment, "seed": self.seed,
            "balance": self.balance, "min_holders": self.min_holders,
            "components": [c.name for c in self.components], "mask": self.mask.astype(int).tolist(),
            "holders_per_component": self.holders_per_component, "keep_per_worker": self.keep_per_worker,
            "keep_bytes_per_worker": self.keep_bytes_per_worker, "shared_bytes": self.shared_bytes,
            "bytes_per_worker": self.bytes_per_worker,
            "distinct_holder_sets": [list(s) for s in self.distinct_holder_sets],
            "connected": self.connected, "spectral_gap": self.spectral_gap,
            "masking_error": self.masking_error, "warnings": self.warnings(),
        }

    def table(self) -> str:
        """Readable text: one row per worker, one per component, then the graph summary."""
        width = max(len(c.name) for c in self.components)
        lines = [f"SDP plan: {self.world_size} workers x {len(self.components)} components ({self.assignment}, "
                 f"seed {self.seed}, balance {self.balance})", "rank   held     C_i  C_i(bytes)           bytes"]
        per_worker = zip(self.keep_per_worker, self.keep_bytes_per_worker, self.bytes_per_worker, strict=True)
        lines += [f"{r:>4}  {int(self.mask[r].sum()):>5}  {ci:>6.3f}  {cb:>10.3f}  {nb:>14,}"
                  for r, (ci, cb, nb) in enumerate(per_worker)]
        lines.append(f"{'component':<{width}}  k_c         bytes  holders")
        lines += [f"{c.name:<{width}}  {len(self.holders(i)):>3}  {c.param_bytes:>12,}  {list(self.holders(i))}"
                  for i, c in enumerate(self.components)]
        lines.append(f"shared bytes {self.shared_bytes:,}; distinct holder sets {len(self.distinct_holder_sets)}; "
                     f"connected {self.connected}; spectral gap {self.spectral_gap:.4f}; "
                     f"masking error {self.masking_error:.4f}")
        return "\n".join(lines + self.warnings())


def _validate_keep(keep: float | Sequence[float] | None, n: int, min_holders: int) -> list[Fraction]:
    if keep is None:
        raise PlanError("keep is required unless assignment='explicit'")
    values = [keep] * n if np.isscalar(keep) else list(keep)
    if len(values) != n:
        raise PlanError(f"keep has {len(values)} entries but world_size is {n}: give one C_i per worker")
    for i, c in enumerate(values):
        ok = isinstance(c, (int, float, np.floating, np.integer)) and not isinstance(c, bool)
        if not (ok and 0.0 < float(c) <= 1.0):
            raise PlanError(f"keep for worker {i} is {c!r}; it must lie in (0, 1]")
    fr = [Fraction(float(c)) for c in values]
    if n == 1 and fr[0] < 1:
        raise PlanError(f"a single worker with keep={float(fr[0])} < 1: the components it drops would never "
                        "be trained and there is nobody to average with; use keep=1.0 with world_size=1")
    if sum(fr) < min_holders:
        raise PlanError(f"coverage unreachable: sum_i C_i * K = {float(sum(fr)):.4g} K slots < "
                        f"min_holders * K = {min_holders} K; raise keep or lower min_holders")
    return fr


def _validate_mask(mask: np.ndarray, n: int, components: list[Component], min_holders: int) -> np.ndarray:
    arr = np.asarray(mask)
    if arr.shape != (n, len(components)):
        raise PlanError(f"explicit mask has shape {arr.shape}; expected (world_size, K) = ({n}, {len(components)})")
    if not np.isin(arr, (0, 1)).all():
        raise PlanError(f"explicit mask must contain only 0/1 values, found {np.unique(arr).tolist()}")
    arr = arr.astype(np.uint8)
    if low := [components[c].name for c in np.flatnonzero(arr.sum(0) < min_holders)]:
        raise PlanError(f"explicit mask: components {low} are held by fewer than min_holders={min_holders} "
                        "workers (a component nobody holds is never trained)")
    if empty := np.flatnonzero(arr.sum(1) == 0).tolist():
        raise PlanError(f"explicit mask: workers {empty} hold no component (keep 0 is outside (0, 1])")
    return arr


def load_mask_file(path: str | Path) -> np.ndarray:
    """An N x K 0/1 mask from a .npy file or a text file of comma/whitespace separated rows
    (blank lines and lines starting with '#' are skipped)."""
    path = Path(path)
    if path.suffix == ".npy":
        arr = np.load(path)
    else:
        rows = [line.replace(",", " ").split() for line in path.read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
        ok = rows and len({len(r) for r in rows}) == 1 and all(v in ("0", "1") for r in rows for v in r)
        arr = np.array([[int(v) for v in r] for r in rows]) if ok else np.zeros(0)
    if arr.ndim != 2 or not np.isin(arr, (0, 1)).all():
        raise PlanError(f"{path}: expected equal-length rows of 0/1 values (a 2-D 0/1 matrix)")
    return arr.astype(np.uint8)


def _weights(components: list[Component], balance: str) -> list[Fraction]:
    """Per-component weight used for balancing (exact fractions, so every rank agrees bit for bit)."""
    by = {"bytes": [int(c.param_bytes) for c in components], "flops": [int(c.flops) for c in components],
          "count": [1] * len(components)}
    if balance in by:
        w = [Fraction(x) for x in by[balance]]
    elif balance == "bytes+flops":  # mean of the two normalised shares
        b, f = max(sum(by["bytes"]), 1), max(sum(by["flops"]), 1)
        w = [Fraction(x, 2 * b) + Fraction(y, 2 * f) for x, y in zip(by["bytes"], by["flops"], strict=True)]
    else:
        raise PlanError(f"unknown balance {balance!r}; choose bytes, flops, count or bytes+flops")
    if sum(w) <= 0 or any(x < 0 for x in w):
        raise PlanError(f"balance={balance!r}: component weights must be >= 0 with a positive total")
    return w


def _arc_mask(w: list[Fraction], keep: list[Fraction], stretch: Fraction) -> np.ndarray:
    """Worker i holds the components whose arc midpoints lie in [a_i, a_i + C_i W) on the circle
    of circumference W, with a_i = W (C_0 + .. + C_{i-1}) * stretch; an arc that holds no midpoint
    takes the component under its centre."""
    total = sum(w)
    ends = list(accumulate(w))
    mids = [e - x / 2 for e, x in zip(ends, w, strict=True)]
    mask = np.zeros((len(keep), len(w)), dtype=np.uint8)
    start = Fraction(0)
    for i, c_i in enumerate(keep):
        a, length = total * start * stretch, c_i * total
        for c, m in enumerate(mids):
            mask[i, c] = (m - a) % total < length
        if not mask[i].any():
            centre = (a + length / 2) % total
            mask[i, next(c for c, e in enumerate(ends) if centre < e)] = 1
        start += c_i
    return mask


def _connect(mask: np.ndarray, w: list[Fraction]) -> np.ndarray:
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


def _cyclic_mask(w: list[Fraction], keep: list[Fraction], min_holders: int) -> np.ndarray:
    """Staggered layout (stretch 1/S) unless it misses coverage or connectivity; then the wrapped
    layout (stretch 1), which always covers every component floor(S) >= min_holders times."""
    staggered, wrapped = _arc_mask(w, keep, 1 / sum(keep)), _arc_mask(w, keep, Fraction(1))
    candidates = [m for m in (staggered, wrapped) if m.sum(0).min() >= min_holders]
    connected = [m for m in candidates if mask_connected(m)]
    return connected[0] if connected else _connect(candidates[0], w)


def _random_mask(w: list[Fraction], keep: list[Fraction], min_holders: int, seed: int) -> np.ndarray:
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


def plan_components(components: list[Component], shared_bytes: int, world_size: int,
                    keep: float | Sequence[float] | None = None, min_holders: int = 1,
                    assignment: str = "cyclic", seed: int = 0, mask: np.ndarray | None = None,
                    balance: str = "bytes", *, shared_params: Sequence[str] = (),
                    shared_numel: int | None = None) -> Plan:
    """Assign components to ``world_size`` workers (cyclic, random or explicit; see the module
    docstring). ``keep`` is C or one C_i per worker (ignored for explicit masks)."""
    if world_size < 1:
        raise PlanError(f"world_size must be >= 1, got {world_size}")
    if not components:
        raise PlanError("no maskable components: nothing to plan")
    if not 1 <= min_holders <= world_size:
        why = f"exceeds world_size={world_size}" if min_holders > 1 else "must be >= 1 (coverage)"
        raise PlanError(f"min_holders={min_holders} {why}")
    if (assignment == "explicit") != (mask is not None):
        raise PlanError(f"assignment={assignment!r} with mask={'given' if mask is not None else None}: an "
                        "explicit N x K 0/1 mask (or load_mask_file(path)) goes with assignment='explicit'")
    if mask is not None:
        m = _validate_mask(mask, world_size, components, min_holders)
    else:
        fr = _validate_keep(keep, world_size, min_holders)
        w = _weights(components, balance)
        if assignment == "cyclic":
            m = _cyclic_mask(w, fr, min_holders)
        elif assignment == "random":
            m = _connect(_random_mask(w, fr, min_holders, seed), w)
        else:
            raise PlanError(f"unknown assignment {assignment!r}; choose cyclic, random or explicit")
    return Plan(list(components), m, int(shared_bytes), seed, assignment, world_size,
                tuple(shared_params), shared_numel, min_holders, balance)


def _plan_model(model: nn.Module, level: str, groups: int, world_size: int, keep, kw: dict) -> Plan:
    extract_kw = {k: kw.pop(k) for k in ("input_shape",) if k in kw}
    comps, shared, shared_bytes = model_components(model, level, groups, **extract_kw)
    numel = sum(p.numel() for n, p in model.named_parameters() if n in shared)
    return plan_components(comps, shared_bytes, world_size, keep, shared_params=shared, shared_numel=numel, **kw)


def plan_blocks(model: nn.Module, world_size: int, keep: float | Sequence[float] | None,
                assignment: str = "cyclic", seed: int = 0, min_holders: int = 1, **kw) -> Plan:
    """B-SDP plan: one component per maskable block (``model.layers`` or ``model.blocks``)."""
    kw.update(assignment=assignment, seed=seed, min_holders=min_holders)
    return _plan_model(model, "block", 1, world_size, keep, kw)


def plan_neurons(model: nn.Module, world_size: int, keep: float | Sequence[float] | None, groups: int = 4,
                 assignment: str = "cyclic", seed: int = 0, min_holders: int = 1, **kw) -> Plan:
    """N-SDP plan: ``groups`` hidden-unit groups per FFN (LLaMA) or inner-channel groups (ResNet)."""
    kw.update(assignment=assignment, seed=seed, min_holders=min_holders)
    return _plan_model(model, "neuron", groups, world_size, keep, kw)


def analytic_bytes_per_step(plan: Plan, rank: int, elem_bytes: int | None = 4) -> dict:
    """Logical bytes ``rank`` feeds into all-reduces per step under holder-group averaging
    (gradients, ``elem_bytes`` per element; None = the parameters' stored dtypes).

    A held component with k_c > 1 contributes its size to its holder set's all-reduce; k_c = 1
    contributes 0; shared parameters go to one all-reduce over all N workers when N > 1. ``ddp`` is
    the same count for DDP (all parameters, N > 1). ``ring_wire`` is what a ring all-reduce sends
    per rank: 2 (k - 1) / k x logical bytes, summed over groups.
    """
    def size(numel: int, nbytes: int) -> int:
        return nbytes if elem_bytes is None else numel * elem_bytes

    n, per_set = plan.world_size, {}
    for c in (c for c in plan.held(rank) if len(plan.holders(c)) > 1):
        per_set[plan.holders(c)] = per_set.get(plan.holders(c), 0) + size(c.elements, c.param_bytes)
    shared = size(plan.shared_numel, plan.shared_bytes) if n > 1 else 0
    everything = size(plan.shared_numel, plan.shared_bytes) + sum(size(c.elements, c.param_bytes)
                                                                  for c in plan.components)
    wire = sum(2 * (len(hs) - 1) / len(hs) * b for hs, b in per_set.items()) + 2 * (n - 1) / n * shared
    return {"shared": shared, "components": sum(per_set.values()), "total": shared + sum(per_set.values()),
            "per_holder_set": per_set, "ring_wire": wire, "ddp": everything if n > 1 else 0,
            "ddp_ring_wire": 2 * (n - 1) / n * everything}
