"""Cache files that cannot lie: each carries its size and sha256 and is checked against them before every use.

The data layer caches three kinds of file under the cache folder (:func:`slimpar.data.corpora.cache_root`): trained
BPE tokenizers (``tokenizers/*.json``), token streams (``tokens/<tokenizer>/*.npy``) and the Wikipedia validation
text (``wikipedia/*.txt``). A truncated or overwritten one used to be read as it was: a shorter validation set with
no warning, or an "mmap length is greater than file size" from deep inside numpy.

Algorithm of :func:`cached`, under an exclusive ``flock`` of ``<file>.lock`` (workers of one job, and concurrent jobs,
build each entry once and never read one half-written):

1. the file is good when ``<file>.integrity`` (written after the file, so it doubles as the completion marker)
   names its exact size and sha256;
2. a file without a record, from an older slimpar, is adopted (its record written) where ``adopt`` confirms it
   whole (a tokenizer that parses, a ``.npy`` whose header matches its length); otherwise rebuilt;
3. a missing file is built; a damaged one (size or hash differ, no record and not adoptable) is rebuilt once with a
   one-line note; a build that fails, or a rebuilt file that still does not verify, is a
   :class:`~slimpar.data.errors.DataUnavailable` naming the file.

Hashing costs about a second per GB, paid by every process that opens the entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from slimpar.data.errors import DataUnavailable
from slimpar.utils import chmod_as_created

RECORD_SUFFIX = ".integrity"  # beside each cache file: {"size": bytes, "sha256": hex}
MISSING = "is missing"


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _record_path(path: Path) -> Path:
    return path.with_name(path.name + RECORD_SUFFIX)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):  # a file system without flock: unlocked, as before
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def write_temporary(path: Path, data: bytes) -> str:
    """``data`` in a new temporary file beside ``path``, on disk (fsync), readable as a cache file; its name."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    chmod_as_created(tmp)  # mkstemp makes 0600; caches are plain readable files
    return tmp


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = ""
    try:
        tmp = write_temporary(path, data)
        os.replace(tmp, path)
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def _write_record(path: Path) -> None:
    record = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    _write_atomic(_record_path(path), json.dumps(record).encode())


def problem(path: Path, adopt: Callable[[Path], bool] | None = None) -> str | None:
    """What is wrong with the cache file ``path`` (None: it verifies; a legacy file that ``adopt`` confirms whole
    gets its record and verifies)."""
    if not path.is_file():
        return MISSING
    try:
        record = json.loads(_record_path(path).read_text())
        size, digest = int(record["size"]), str(record["sha256"])
    except FileNotFoundError:
        if adopt is not None and adopt(path):
            _write_record(path)
            return None
        return "has no integrity record (its write was cut short, or an older slimpar wrote it)"
    except (OSError, ValueError, KeyError, TypeError):
        return "has an unreadable integrity record"
    actual = path.stat().st_size
    if actual != size:
        return f"is {actual:,} bytes where its record says {size:,} (truncated or overwritten)"
    if sha256_file(path) != digest:
        return "does not match its recorded sha256 (its bytes changed)"
    return None


def cached(path: Path, build: Callable[[], bytes], adopt: Callable[[Path], bool] | None = None) -> Path:
    """``path``, verified; built by ``build`` where missing, rebuilt once where damaged (see the module docstring)."""
    with _locked(path):
        wrong = problem(path, adopt)
        if wrong is None:
            return path
        if wrong != MISSING:
            print(f"note: cache file {path} {wrong}; rebuilding it", flush=True)
        try:
            _record_path(path).unlink(missing_ok=True)  # no record names a file while it is replaced
            _write_atomic(path, build())
            _write_record(path)  # last: the completion marker
        except OSError as e:
            raise DataUnavailable(f"cache file {path} {wrong} and could not be rebuilt ({e.strerror or e}); delete "
                                  "it, or set --data.cache_dir (or $SLIMPAR_CACHE) to a writable folder") from None
        again = problem(path)
        if again is not None:
            raise DataUnavailable(f"cache file {path} {again} right after it was rebuilt (a failing or full disk?); "
                                  "delete it, or set --data.cache_dir (or $SLIMPAR_CACHE) to another folder")
    return path
