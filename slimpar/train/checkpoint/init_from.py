"""``--model.init_from``: the folder a run starts from, checked against what it held at the run's first start.

The folder (a Hugging Face LLaMA: ``config.json`` for the shape, ``model.safetensors`` for the weights)
lives outside the run folder, so it can change between a run's first start and a later one: an
updated download, another model copied over it. A resume would then build another model's shape or
weights into the run without a word. So the first start records the sha256 and size of the files it
reads in ``OUT/init_from.json`` (:func:`record_init_from`, in ``prepare_out_dir``), and every later use
of the run folder checks the folder against the record (:func:`check_init_from`): ``slimpar train`` in
the launching process (exit 2, before anything is written), every worker again before it reads the
weights, ``slimpar eval`` and ``slimpar export``. ``--fresh`` deletes the record and a new one is made.
The record proves what the folder held at the first start; like a manifest, it is no protection against
someone who can write the run folder (docs/trust.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from slimpar.config import Config, ConfigError
from slimpar.train.checkpoint.manifest import file_mismatch, sha256_of
from slimpar.utils import write_text_atomic

INIT_FROM_RECORD = "init_from.json"
INIT_FROM_FILES = ("config.json", "model.safetensors")  # what build.py reads from the folder


def _entries(folder: Path) -> dict[str, dict]:
    return {n: {"sha256": sha256_of(folder / n), "size": (folder / n).stat().st_size}
            for n in INIT_FROM_FILES if (folder / n).is_file()}


def record_init_from(cfg: Config, out_dir: Path) -> Path | None:
    """At a run's first start (rank 0 / the launcher): write ``OUT/init_from.json`` with the sha256 and size
    of the init_from folder's files. A record that exists is kept: it describes the first start."""
    if not cfg.model.init_from:
        return None
    path = Path(out_dir) / INIT_FROM_RECORD
    if path.is_file():
        return path
    folder = Path(cfg.model.init_from)
    record = {"format": 1, "algorithm": "sha256", "folder": str(folder.resolve()), "files": _entries(folder)}
    write_text_atomic(path, json.dumps(record, indent=1) + "\n")
    return path


def _read_record(path: Path) -> dict:
    fix = f"delete {path} if you trust the folder, or start over with --fresh"
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
        files = record["files"]
        if not isinstance(files, dict) or not all(
                isinstance(e, dict) and isinstance(e.get("sha256"), str) and isinstance(e.get("size"), int)
                for e in files.values()) or not set(files) <= set(INIT_FROM_FILES):
            raise ValueError("unexpected layout")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path} is not a valid model.init_from record ({e}); {fix}") from None
    return record


def check_init_from(cfg: Config, out_dir: Path) -> None:
    """Check the ``model.init_from`` folder's files against ``OUT/init_from.json`` (size, then sha256);
    nothing to check without init_from or without a record. Raises ConfigError (exit 2) naming the file."""
    record_path = Path(out_dir) / INIT_FROM_RECORD
    if not cfg.model.init_from or not record_path.is_file():
        return
    record = _read_record(record_path)
    folder = Path(cfg.model.init_from)
    first = record.get("folder", "?")
    fix = (f"this run first started from {first}, whose files {record_path} records; restore them, or start "
           "over from the new files with --fresh (or a new --out)")
    for name, entry in record["files"].items():
        p = folder / name
        why = file_mismatch(p, entry)
        if why == "missing":
            raise ConfigError(f"model.init_from: {p} is missing; {fix}")
        if why is not None and why.startswith("size"):
            raise ConfigError(f"model.init_from: {p} has changed: {why[5:]} bytes, {entry['size']} at the first "
                              f"start; {fix}")
        if why is not None:
            raise ConfigError(f"model.init_from: {p} has changed: its sha256 is not the one recorded at the "
                              f"first start; {fix}")
    missing = [n for n in INIT_FROM_FILES if n not in record["files"] and (folder / n).is_file()]
    if missing:
        raise ConfigError(f"model.init_from: {folder / missing[0]} was not there at the first start; {fix}")
