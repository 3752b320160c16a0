"""The torch versions slimpar supports, and the one check of the installed torch against them.

This module imports no torch (it reads the installed distribution's metadata), so ``slimpar --version`` and the
command line's first check stay light. The range here is the one ``pyproject.toml`` declares (a test holds the two
equal); the APIs newer than the floor are reached through ``slimpar.parallel.compat``.
"""

from __future__ import annotations

import importlib.util
import re
from importlib import metadata
from pathlib import Path

FLOOR = (2, 11)  # tested in CI on this version (.ci/run's floor leg)
CEILING = (2, 16)  # exclusive: the newest release the registry served when the range was set is 2.15
SUPPORTED = f">={FLOOR[0]}.{FLOOR[1]},<{CEILING[0]}.{CEILING[1]}"


class UnsupportedTorch(RuntimeError):
    """The installed torch is outside :data:`SUPPORTED`."""


def installed_torch() -> str | None:
    """The installed torch's version string ("2.11.0+cu130"), or None where torch is not installed.

    From the distribution's metadata; a torch without any (built from source, copied into an image) is read from
    its ``version.py``, still without importing torch."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        text = (Path(folder) / "version.py").read_text() if (Path(folder) / "version.py").exists() else ""
        m = re.search(r"^__version__\s*(?::\s*str)?\s*=\s*['\"]([^'\"]+)['\"]", text, flags=re.M)
        if m:
            return m.group(1)
    return None


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string: "2.11.0+cu130" -> (2, 11), "2.16.0.dev20261101" -> (2, 16)."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise UnsupportedTorch(f"cannot read torch's version {version!r}")
    return int(m.group(1)), int(m.group(2))


def check_torch(version: str | None = None) -> str:
    """The installed torch's version if slimpar supports it; else :class:`UnsupportedTorch` with one line that
    names the installed and the supported versions and what to do."""
    version = installed_torch() if version is None else version
    if version is None:
        raise UnsupportedTorch(f"torch is not installed; slimpar needs torch {SUPPORTED}: "
                               f"pip install 'torch{SUPPORTED}'")
    if not FLOOR <= release(version) < CEILING:
        raise UnsupportedTorch(f"torch {version} is installed; slimpar supports torch {SUPPORTED}. Install a torch in "
                               f"that range (pip install 'torch{SUPPORTED}'), or a slimpar made for this torch")
    return version


def describe() -> str:
    """The line ``slimpar --version`` prints after slimpar's own version."""
    return f"torch {installed_torch() or 'not installed'} (slimpar supports torch {SUPPORTED})"
