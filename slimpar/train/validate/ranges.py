"""The allowed interval of a numeric config field (shared by the validators of every section)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """The allowed interval of one numeric field; ``None`` bounds are open-ended."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # exclude lo itself (e.g. a learning rate must be > 0)
    hi_open: bool = False  # exclude hi itself (e.g. an Adam beta must be < 1)
    why: str = ""  # what the field means, so the message explains the bound

    def contains(self, v: float) -> bool:
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return False
        return self.hi is None or (v < self.hi or (not self.hi_open and v == self.hi))

    def describe(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        return f"{'<' if self.hi_open else '<='} {self.hi:g}"
