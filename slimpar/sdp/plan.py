"""SDP planner: which worker holds which component (docs/methods.md, 'Masks and plans').

Pure and deterministic in (seed, world size, model structure): every rank computes every rank's
mask without communicating, and a restart recomputes the same masks.

Mask M (N workers x K components, 0/1); holder set S_c = {i : M_ic = 1}, k_c = |S_c|. Graph metrics
use maskable components only (shared parameters, held by all, would connect every graph trivially):
- connected: the bipartite worker-component graph is connected (a worker without components is not);
- W = D_w^-1 M D_c^-1 M^T (row-stochastic); spectral gap rho = 1 - lambda_2(W) from the similar
  symmetric D_w^-1/2 M D_c^-1 M^T D_w^-1/2; rho > 0 iff connected; rho = 1 for N = 1;
- masking error = sum_c (1/k_c - 1/N) / K (excess gradient variance at unit sigma_c^2).
They live in ``graph.py`` (near-linear in N: union-find, the smaller of the two Gram matrices).

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
  If neither layout is connected, the covered one is joined up by ``connect_by_adding`` (cheapest links).
- random: k_c = floor(S) for every c, plus one for a seeded random subset of components whose
  weight sums to about (S - floor(S)) W; k_c is raised to min_holders. Components are placed
  heaviest first (random tie-break) on the k_c workers with the largest remaining deficit
  C_i W - load_i (random tie-break). A disconnected result is joined up by swaps
  (``connect_by_swaps``), which keep every worker's count and every k_c: while two parts exist and
  one has a cycle, an edge (i, c) on that cycle and an edge (j, d) of another part become (i, d) and
  (j, c), merging the two parts. A connected graph with those counts exists iff every worker holds
  a component and sum_c k_c >= N + K - 1 (then some part has a cycle while the graph is
  disconnected), so swaps always suffice then; otherwise (an empty worker, too few slots) the
  missing links are added by ``connect_by_adding``, the fewest that connect the graph.
  ``holder_sets=G`` bounds the process groups: the components go into G bundles of nearly equal
  weight (``bundles``), the bundles are placed by the rule above, and a component gets its
  bundle's holders, so there are at most G distinct holder sets.
- explicit: a user mask, validated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from slimpar.sdp.assign import bundles, connect_by_adding, connect_by_swaps, cyclic_mask, random_mask
from slimpar.sdp.budget import MemoryPrediction
from slimpar.sdp.components import Component, PlanError
from slimpar.sdp.graph import (
    averaging_operator,
    mask_connected,
    masking_error,
    spectral_gap,
)
from slimpar.sdp.plan_inputs import component_weights, load_mask_file, validate_keep, validate_mask

__all__ = ["Plan", "PlanError", "plan_components", "load_mask_file", "analytic_bytes_per_step",
           "averaging_operator", "spectral_gap", "mask_connected", "masking_error"]


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
    memory: MemoryPrediction | None = None  # planned from memory budgets: each worker's predicted peak
    keep_asked: tuple[float, ...] | None = None  # C_i as asked (None: an explicit mask or memory budgets)

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
        b = np.array([c.param_bytes for c in self.components], dtype=np.int64)
        return [self.shared_bytes + int(x) for x in self.mask.astype(np.int64) @ b]

    def holder_sets(self) -> list[tuple[int, ...]]:
        """S_c for every component, in component order."""
        sets: list[list[int]] = [[] for _ in self.components]
        for c, r in zip(*(x.tolist() for x in np.nonzero(self.mask.T)), strict=True):
            sets[c].append(r)
        return [tuple(s) for s in sets]

    @property
    def distinct_holder_sets(self) -> list[tuple[int, ...]]:
        """Every distinct S_c, sorted lexicographically: the same order on every rank, so process
        groups can be created from it collectively. Singletons need no collective."""
        return sorted(set(self.holder_sets()))

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
        out = [] if self.connected else ["mask graph disconnected (spectral gap 0): some groups of "
                                         "workers never average any component together"]
        return out + self._rounded_keeps()

    def _rounded_keeps(self) -> list[str]:
        """Where a worker holds another share than asked: a keep is rounded to whole components."""
        if self.keep_asked is None:
            return []
        k = len(self.components)
        unit = "blocks" if all(c.index is None for c in self.components) else "unit groups"
        rounded: dict[tuple[float, int], list[int]] = {}
        for i, (asked, held) in enumerate(zip(self.keep_asked, self.mask.sum(1).tolist(), strict=True)):
            if abs(asked - held / k) > 1e-9:
                rounded.setdefault((asked, int(held)), []).append(i)
        return [f"keep {asked:.3g} asked, worker{'s' if len(ws) > 1 else ''} {_spans(ws)} "
                f"hold{'' if len(ws) > 1 else 's'} {held / k:.3g} ({held} of {k} whole {unit})"
                for (asked, held), ws in rounded.items()]

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
            "keep_asked": None if self.keep_asked is None else list(self.keep_asked),
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
        lines += [f"{c.name:<{width}}  {len(hs):>3}  {c.param_bytes:>12,}  {list(hs)}"
                  for c, hs in zip(self.components, self.holder_sets(), strict=True)]
        lines.append(f"shared bytes {self.shared_bytes:,}; distinct holder sets {len(self.distinct_holder_sets)}; "
                     f"connected {self.connected}; spectral gap {self.spectral_gap:.4f}; "
                     f"masking error {self.masking_error:.4f}")
        return "\n".join(lines + self.warnings())


def _spans(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def _random_plan(w: list[Fraction], keep: list[Fraction], min_holders: int, seed: int,
                 holder_sets: int | None) -> np.ndarray:
    """Random placement of components (or of at most ``holder_sets`` bundles of them), joined up."""
    groups = bundles(w, holder_sets, seed) if holder_sets and holder_sets < len(w) else [[c] for c in range(len(w))]
    gw = [sum((w[c] for c in g), Fraction(0)) for g in groups]
    gm = connect_by_adding(connect_by_swaps(random_mask(gw, keep, min_holders, seed), gw, seed), gw)
    m = np.zeros((len(keep), len(w)), dtype=np.uint8)
    for j, g in enumerate(groups):
        m[:, g] = gm[:, [j]]
    return m


def plan_components(components: list[Component], shared_bytes: int, world_size: int,
                    keep: float | Sequence[float] | None = None, min_holders: int = 1,
                    assignment: str = "cyclic", seed: int = 0, mask: np.ndarray | None = None,
                    balance: str = "bytes", *, shared_params: Sequence[str] = (),
                    shared_numel: int | None = None, holder_sets: int | None = None) -> Plan:
    """Assign components to ``world_size`` workers (cyclic, random or explicit; see the module
    docstring). ``keep`` is C or one C_i per worker (ignored for explicit masks). ``holder_sets``
    (random only) bounds the distinct holder sets, i.e. the process groups: the components are
    bundled into that many bundles of nearly equal weight, and each bundle is placed as one."""
    if world_size < 1:
        raise PlanError(f"world_size must be >= 1, got {world_size}")
    if not components:
        raise PlanError("no maskable components: nothing to plan")
    if not 1 <= min_holders <= world_size:
        why = f"exceeds world_size={world_size}" if min_holders > 1 else "must be >= 1 (coverage)"
        raise PlanError(f"min_holders={min_holders} {why}")
    if holder_sets is not None and (assignment != "random" or int(holder_sets) != holder_sets or holder_sets < 1):
        raise PlanError(f"holder_sets={holder_sets!r}: a positive integer, with assignment='random' only")
    if (assignment == "explicit") != (mask is not None):
        raise PlanError(f"assignment={assignment!r} with mask={'given' if mask is not None else None}: an "
                        "explicit N x K 0/1 mask (or load_mask_file(path)) goes with assignment='explicit'")
    asked = None
    if mask is not None:
        m = validate_mask(mask, world_size, components, min_holders)
    else:
        fr = validate_keep(keep, world_size, min_holders)
        asked = tuple(float(c) for c in fr)
        w = component_weights(components, balance)
        if assignment == "cyclic":
            m = cyclic_mask(w, fr, min_holders)
        elif assignment == "random":
            m = _random_plan(w, fr, min_holders, seed, holder_sets)
        else:
            raise PlanError(f"unknown assignment {assignment!r}; choose cyclic, random or explicit")
    return Plan(list(components), m, int(shared_bytes), seed, assignment, world_size,
                tuple(shared_params), shared_numel, min_holders, balance, keep_asked=asked)


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
    for col in np.flatnonzero(plan.mask[rank]).tolist():
        c, hs = plan.components[col], plan.holders(col)
        if len(hs) > 1:
            per_set[hs] = per_set.get(hs, 0) + size(c.elements, c.param_bytes)
    shared = size(plan.shared_numel, plan.shared_bytes) if n > 1 else 0
    everything = size(plan.shared_numel, plan.shared_bytes) + sum(size(c.elements, c.param_bytes)
                                                                  for c in plan.components)
    wire = sum(2 * (len(hs) - 1) / len(hs) * b for hs, b in per_set.items()) + 2 * (n - 1) / n * shared
    return {"shared": shared, "components": sum(per_set.values()), "total": shared + sum(per_set.values()),
            "per_holder_set": per_set, "ring_wire": wire, "ddp": everything if n > 1 else 0,
            "ddp_ring_wire": 2 * (n - 1) / n * everything}
