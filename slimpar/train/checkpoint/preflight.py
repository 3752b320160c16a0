"""The launching process's check of the checkpoint a resume would load, before any worker starts.

Its own module so that the launcher imports DCP (which loads torch's DTensor, about half a second of every run's
start) only where there is a checkpoint to verify."""

from __future__ import annotations

from pathlib import Path

from slimpar.train.checkpoint.folders import latest_checkpoint
from slimpar.train.checkpoint.layout import check_layout, checkpoint_layout

# checkpoint folder -> its files' (name, size, mtime) when this process last verified it: the launcher checks a
# resume twice (before the config loads, then with it for the layout), and hashing every file once is enough
_VERIFIED: dict[Path, tuple[tuple[str, int, int], ...]] = {}


def _files(path: Path) -> tuple[tuple[str, int, int], ...]:
    stats = ((p.relative_to(path).as_posix(), p.stat()) for p in path.rglob("*") if p.is_file())
    return tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in stats))


def check_resume(out_dir: Path, cfg=None) -> Path | None:
    """Verify the checkpoint a resume would load (the newest complete one in ``out_dir``: manifest, ``trainer.json``,
    DCP metadata), and with the run's ``cfg`` that it can load it (:func:`check_layout`); None when there is none.
    Raises ManifestError / ConfigError (exit 2).

    A folder this process verified already is not hashed again while no file in it was added, removed, resized or
    rewritten since (each worker still verifies it before loading it: ``load_checkpoint``)."""
    path = latest_checkpoint(Path(out_dir))
    if path is not None:
        key, files = path.resolve(), _files(path)
        if _VERIFIED.get(key) != files:
            from slimpar.train.checkpoint.dcp import verify_checkpoint

            verify_checkpoint(path)
            _VERIFIED[key] = files
        if cfg is not None:
            check_layout(path, checkpoint_layout(cfg))
    return path
