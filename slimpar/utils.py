"""Small helpers shared by every layer (bottom layer: imports nothing else of slimpar)."""

from __future__ import annotations


def fmt_bytes(n: float | None) -> str:
    """A byte count for people: ``1536`` -> ``"1.5 KiB"``; ``None`` -> ``"-"``."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)
