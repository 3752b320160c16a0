"""The launching process's check of the checkpoint a resume would load, before any worker starts.

Its own module so that the launcher imports DCP (which loads torch's DTensor, about half a second of every run's
start) only where there is a checkpoint to verify."""

from __future__ import annotations

from pathlib import Path

from slimpar.train.checkpoint.folders import latest_checkpoint
from slimpar.train.checkpoint.layout import check_layout, checkpoint_layout


def check_resume(out_dir: Path, cfg=None) -> Path | None:
    """Verify the checkpoint a resume would load (the newest complete one in ``out_dir``: manifest, ``trainer.json``,
    DCP metadata), and with the run's ``cfg`` that it can load it (:func:`check_layout`); None when there is none.
    Raises ManifestError / ConfigError (exit 2)."""
    path = latest_checkpoint(Path(out_dir))
    if path is not None:
        from slimpar.train.checkpoint.dcp import verify_checkpoint

        verify_checkpoint(path)
        if cfg is not None:
            check_layout(path, checkpoint_layout(cfg))
    return path
