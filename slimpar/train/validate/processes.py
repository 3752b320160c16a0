"""How a run's workers map to processes (read by the validators, the memory floor and the launcher)."""

from __future__ import annotations

from slimpar.config import Config


def runs_in_process(cfg: Config) -> bool:
    """Whether slimpar's launcher runs every worker in its own process: single, virtual pipelines, virtual SDP."""
    p = cfg.parallel
    return p.mode == "single" or (p.mode == "pipeline" and cfg.pipeline.virtual) or (
        p.mode == "sdp" and cfg.sdp.virtual)
