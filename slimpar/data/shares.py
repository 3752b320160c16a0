"""Which samples of a step's global batch a worker takes: the one rule both data sets use.

A step's global batch is ``global_batch`` samples at the *global sample positions*
``[step * global_batch, (step + 1) * global_batch)``. Worker ``rank`` of ``world`` takes the contiguous
slice ``[step * B + rank * b, step * B + (rank + 1) * b)`` with ``b = B // world``. The positions depend only
on (step, B), never on the layout: a run that changes its worker count keeps consuming the same sequence
of positions, each exactly once, which ``log.samples`` records (docs/outputs.md).
"""

from __future__ import annotations


def batch_share(step: int, rank: int, world: int, global_batch: int) -> range:
    """The global sample positions worker ``rank`` of ``world`` trains on at ``step`` (a contiguous range)."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world; got rank={rank}, world={world}")
    if global_batch % world:
        raise ValueError(f"global batch {global_batch} does not split evenly over {world} workers")
    b = global_batch // world
    first = step * global_batch + rank * b
    return range(first, first + b)
