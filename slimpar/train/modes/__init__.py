"""One protocol per parallel mode (:class:`~slimpar.train.modes.base.Mode`): what the start-up checks, the memory
floor, the launcher, the checkpoint layout and ``slimpar plan`` ask of a run's ``parallel.mode``, answered by the
mode instead of branched on by each of them. The strategies (slimpar.train.strategies) build what the mode names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slimpar.train.modes.base import Mode
from slimpar.train.modes.pipeline import Pipeline
from slimpar.train.modes.plain import DDP, FSDP, Single
from slimpar.train.modes.sdp import SDP

if TYPE_CHECKING:
    from slimpar.config import Config

__all__ = ["MODES", "Mode", "mode_of"]

MODES: dict[str, Mode] = {m.name: m for m in (Single(), DDP(), FSDP(), SDP(), Pipeline())}


def mode_of(cfg: Config) -> Mode:
    """The run's mode (ConfigError naming the choices for an unknown ``parallel.mode``)."""
    from slimpar.config import check_choice

    check_choice("parallel.mode", cfg.parallel.mode, tuple(MODES))
    return MODES[cfg.parallel.mode]
