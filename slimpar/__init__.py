"""slimpar: train models that do not fit the hardware or the network — subnetwork data parallelism
(SDP) and compressed pipeline parallelism (MAPL) on torch.distributed."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = ["SubnetworkDataParallel", "models", "sdp", "__version__"]


def __getattr__(name: str) -> Any:
    """Import torch-backed parts on first use (PEP 562): ``slimpar --version``, ``--help`` and the command
    line's first steps stay light, and Ctrl-C during start-up reaches the command's handler, not an import."""
    if name in ("models", "sdp"):
        return importlib.import_module(f"slimpar.{name}")
    if name == "SubnetworkDataParallel":
        from slimpar.sdp.wrapper import SubnetworkDataParallel

        return SubnetworkDataParallel
    raise AttributeError(f"module 'slimpar' has no attribute {name!r}")
