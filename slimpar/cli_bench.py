"""Where ``slimpar bench`` finds the benchmarks: the repository's ``benchmarks/`` folder.

The benchmarks are not part of the installed package (a wheel holds ``slimpar`` only), so the library never
imports them. From a source checkout the folder sits beside the ``slimpar`` package directory; it is put on
``sys.path`` and loaded by name at run time (importlib, no static import). Without a checkout ``slimpar bench``
ends with one line that says where the benchmarks live (exit 2, like every bad input).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from slimpar.config import ConfigError

PACKAGE = "benchmarks"

MISSING = ("slimpar bench runs the benchmarks in the repository's benchmarks/ folder, which an installed slimpar "
           "does not include: clone the slimpar repository and run, from its root, "
           "PYTHONPATH=$PWD python -m slimpar bench ...")


def benchmarks_folder() -> Path:
    """The checkout's ``benchmarks/`` folder: beside the directory of the ``slimpar`` package in use."""
    import slimpar

    return Path(slimpar.__file__).resolve().parent.parent / PACKAGE


def load_benchmarks_cli(folder: Path | None = None) -> ModuleType:
    """``benchmarks.cli`` from ``folder`` (default :func:`benchmarks_folder`); a ``ConfigError`` naming where
    the benchmarks live when the folder is missing, or when another package of that name is found first."""
    folder = (folder or benchmarks_folder()).resolve()
    if not (folder / "__init__.py").is_file() or not (folder / "cli.py").is_file():
        raise ConfigError(MISSING)
    root = str(folder.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    module = importlib.import_module(f"{PACKAGE}.cli")
    if Path(module.__file__).resolve().parent != folder:
        raise ConfigError(f"slimpar bench: the package {PACKAGE!r} imported from {Path(module.__file__).parent} "
                          f"is not the checkout's {folder}; run from a shell where it is not on the path")
    return module
