"""How a run's workers map to processes (read by the validators, the memory floor and the launcher)."""

from __future__ import annotations

from slimpar.config import Config


def runs_in_process(cfg: Config) -> bool:
    """Whether slimpar's launcher runs every worker in its own process: single, virtual pipelines, virtual SDP."""
    from slimpar.train.modes import mode_of

    return mode_of(cfg).in_process(cfg)
