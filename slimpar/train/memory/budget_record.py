"""The run folder's record of ``sdp.memory_budget`` (``memory_budget.json``): the keeps the launcher chose and
every rank's predicted memory. Apart from ``memory_budget`` so that the SDP strategy can read it without
importing the search (which builds plans through the strategy)."""

from __future__ import annotations

import json
from pathlib import Path

RECORD = "memory_budget.json"  # in the run folder: budgets, chosen keeps, predicted peaks per worker and rank


def write_record(out_dir: Path, record: dict | None) -> None:
    """:data:`RECORD` in the run folder (removed when this run has no budget: no stale promise)."""
    path = Path(out_dir) / RECORD
    if record is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(json.dumps(record, indent=2))


def read_record(out_dir: Path) -> dict | None:
    path = Path(out_dir) / RECORD
    return json.loads(path.read_text()) if path.is_file() else None
