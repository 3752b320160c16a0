"""slimpar: train models that do not fit the hardware or the network — subnetwork data parallelism
(SDP) and compressed pipeline parallelism (MAPL) on torch.distributed."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# The libraries a user reaches as ``slimpar.NAME`` after a plain ``import slimpar`` (the trainer and the commands
# are the application, imported by the command line, not by users; the benchmarks live outside the package).
_SUBPACKAGES = ("codecs", "data", "hybrid", "integrations", "models", "optim", "parallel", "pipeline", "sdp")

__all__ = ["SubnetworkDataParallel", "__version__", *_SUBPACKAGES]


def __getattr__(name: str) -> Any:
    """Import torch-backed parts on first use (PEP 562): ``slimpar --version``, ``--help`` and the command
    line's first steps stay light, and Ctrl-C during start-up reaches the command's handler, not an import."""
    if name in _SUBPACKAGES:
        return importlib.import_module(f"slimpar.{name}")
    if name == "SubnetworkDataParallel":
        from slimpar.sdp.wrapper import SubnetworkDataParallel

        return SubnetworkDataParallel
    raise AttributeError(f"module 'slimpar' has no attribute {name!r}")


def __dir__() -> list[str]:
    # what a REPL's completion offers: the lazy names too, which module attributes alone would not show
    return sorted({*globals(), *__all__})
