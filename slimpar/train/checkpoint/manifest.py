"""Checksum manifests: ``manifest.json`` lists the sha256 and size of every file of a checkpoint or export.

Written after the files themselves (a checkpoint's by rank 0 after the save barrier, before the
``trainer.json`` that marks the save complete); verified before anything reads them. Verification
refuses a file that is missing, truncated, changed or not listed, with a :class:`ManifestError` (a
``ConfigError``: exit 2 before processes start) that names the file and what to do. The manifest
protects against corruption and accidental or partial tampering; it protects against a crafted file
only as far as the manifest itself is trusted. That a crafted file runs no code does not rest on it:
DCP checkpoints are read by restricted unpicklers (:mod:`slimpar.train.checkpoint.safe_dcp`, docs/trust.md).

``python -m slimpar.train.checkpoint.manifest write FOLDER`` re-creates a manifest for a folder you trust
(e.g. a checkpoint written by a slimpar without manifests); ``... verify FOLDER`` checks one.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from slimpar.config import ConfigError
from slimpar.utils import write_text_atomic

MANIFEST = "manifest.json"
FORMAT = 1


class ManifestError(ConfigError):
    """Files that do not match their manifest (or have none); the message names the file and the fix."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _listed_files(folder: Path) -> list[str]:
    """Every regular file under ``folder`` (relative, sorted) except the manifest and temporary files."""
    out = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and rel != MANIFEST and not rel.endswith(".tmp"):
            out.append(rel)
    return out


def write_manifest(folder: str | os.PathLike[str], files: Iterable[str] | None = None,
                   extra: Mapping[str, bytes] | None = None) -> Path:
    """Write ``folder/manifest.json`` atomically for ``files`` (names relative to ``folder``; default: all).

    ``extra`` lists files by their content before they are written (a checkpoint's ``trainer.json``,
    which must stay the last file written), so the manifest can cover them too.
    """
    folder = Path(folder)
    names = _listed_files(folder) if files is None else sorted(files)
    entries = {n: {"sha256": sha256_of(folder / n), "size": (folder / n).stat().st_size} for n in names}
    for n, data in (extra or {}).items():
        entries[n] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    write_text_atomic(folder / MANIFEST, json.dumps({"format": FORMAT, "algorithm": "sha256",
                                                     "files": dict(sorted(entries.items()))}, indent=1) + "\n")
    return folder / MANIFEST


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, dict]:
    """The manifest's ``{name: {"sha256", "size"}}``, or ManifestError if it is missing or malformed."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise ManifestError(f"{folder} has no {MANIFEST} (its sha256 checksums), so its files cannot be trusted: "
                            "it was written by an older slimpar, or tampered with. If you trust this folder, "
                            f"re-create it with: python -m slimpar.train.checkpoint.manifest write {folder}")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
        files = data["files"]
        if data.get("format") != FORMAT or not isinstance(files, dict) or not all(
                isinstance(e, dict) and isinstance(e.get("sha256"), str) and isinstance(e.get("size"), int)
                for e in files.values()):
            raise ValueError("unexpected layout")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ManifestError(f"{path} is not a valid slimpar manifest ({e}); the folder cannot be verified. "
                            "Use another checkpoint or run folder") from None
    for name in files:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ManifestError(f"{path} lists {name!r}, outside its folder; the manifest was tampered with")
    return files


def file_mismatch(path: Path, entry: Mapping) -> str | None:
    """Why ``path`` is not the file ``entry`` (size, sha256) records: "missing", "size N" or "sha256"; None if it is."""
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != entry["size"]:
        return f"size {size}"
    return "sha256" if sha256_of(path) != entry["sha256"] else None


def verify_manifest(folder: str | os.PathLike[str], *, complete: bool = True) -> dict[str, dict]:
    """Check every file listed in ``folder/manifest.json`` (size, then sha256) before anything reads it.

    ``complete``: also refuse files the manifest does not list (a checkpoint folder holds nothing else).
    Returns the manifest's entries; raises ManifestError naming the first bad file.
    """
    folder = Path(folder)
    files = read_manifest(folder)
    fix = "the folder is corrupt or was tampered with; use another checkpoint (or start over with a new --out)"
    for name, entry in files.items():
        p = folder / name
        why = file_mismatch(p, entry)
        if why == "missing":
            raise ManifestError(f"{p} is missing (listed in {folder / MANIFEST}); {fix}")
        if why is not None and why.startswith("size"):
            raise ManifestError(f"{p} has {why[5:]} bytes, its manifest says {entry['size']} (truncated or changed); "
                                f"{fix}")
        if why is not None:
            raise ManifestError(f"{p} does not match its sha256 in {folder / MANIFEST} (changed bytes); {fix}")
    if complete:
        extra = [n for n in _listed_files(folder) if n not in files]
        if extra:
            raise ManifestError(f"{folder} holds files its manifest does not list ({', '.join(extra[:5])}); {fix}")
    return files


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("write", "verify"):
        print("usage: python -m slimpar.train.checkpoint.manifest write|verify FOLDER", file=sys.stderr)
        return 2
    try:
        if args[0] == "write":
            print(f"wrote {write_manifest(args[1])}")
        else:
            print(f"{args[1]}: {len(verify_manifest(args[1]))} files verified")
    except ConfigError as e:
        print(f"slimpar: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
