"""Tracker sinks: where rank 0 sends the numbers of ``metrics.jsonl`` and ``summary.json`` besides those files.

A sink has ``write(record)`` (one metrics.jsonl record), ``write_summary(summary, step)`` (the closing numbers)
and ``close()``. :func:`build_sinks` makes one per tracker the config turns on (``log.tensorboard``,
``log.mlflow``); the trainer talks to the list only.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Protocol

from slimpar.config import Config, ConfigError
from slimpar.train.sinks.scalars import SUMMARY_KEYS, record_scalars, summary_scalars  # noqa: F401  (re-exported)

# config field -> (the module it imports, the extra that installs it)
TRACKERS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}


class Sink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def write_summary(self, summary: dict[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


def check_trackers(cfg: Config) -> None:
    """Exit 2 before anything starts when a tracker is turned on but its package is missing."""
    for name, (module, extra) in TRACKERS.items():
        if getattr(cfg.log, name) and importlib.util.find_spec(module) is None:
            raise ConfigError(f"log.{name} = true needs the {module} package: pip install 'slimpar[{extra}]', "
                              f"or drop --log.{name}")


def build_sinks(cfg: Config, out_dir: Path) -> list[Sink]:
    """The sinks the config turns on (rank 0 only)."""
    sinks: list[Sink] = []
    if cfg.log.tensorboard:
        from slimpar.train.sinks.tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(out_dir))
    if cfg.log.mlflow:
        from slimpar.train.sinks.mlflow_sink import MLflowSink

        sinks.append(MLflowSink(out_dir, cfg))
    return sinks
