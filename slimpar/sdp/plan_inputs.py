"""The planner's inputs, checked: keep fractions, an explicit mask (or a mask file), and component weights.

Every check raises :class:`~slimpar.sdp.components.PlanError` with the fix; weights are exact fractions, so every rank
balances bit for bit alike (:mod:`slimpar.sdp.plan`).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

from slimpar.sdp.components import Component, PlanError


def validate_keep(keep: float | Sequence[float] | None, n: int, min_holders: int) -> list[Fraction]:
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


def validate_mask(mask: np.ndarray, n: int, components: list[Component], min_holders: int) -> np.ndarray:
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


def component_weights(components: list[Component], balance: str) -> list[Fraction]:
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
