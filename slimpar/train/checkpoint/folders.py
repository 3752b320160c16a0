"""Where a run's checkpoints live and which is the newest complete one: folder names only, no torch (the grace
timer of a stop signal reads them in a process that may not have imported torch, and must not wait for it)."""

from __future__ import annotations

import re
from pathlib import Path

STEP_DIR = re.compile(r"^step_(\d{6})$")


def checkpoint_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "checkpoints"


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The newest checkpoint folder whose ``trainer.json`` (written last) exists; None where there is none."""
    root = checkpoint_dir(out_dir)
    if not root.is_dir():
        return None
    done = [d for d in root.iterdir() if STEP_DIR.match(d.name) and (d / "trainer.json").is_file()]
    return max(done, key=lambda d: d.name) if done else None
