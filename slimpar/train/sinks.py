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

# summary.json keys logged once, at the last step (memory and bytes are measured on one instrumented step)
SUMMARY_KEYS = ("val_loss", "val_bits_per_byte", "val_wikipedia_loss", "val_accuracy", "peak_mem_bytes",
                "comm_bytes_per_step", "wire_bytes_per_step", "step_time_s", "tokens_per_s",
                "comm_bytes_per_step_fwd", "comm_bytes_per_step_bwd", "compression_ratio",
                "tied_bytes_per_step_fwd", "tied_bytes_per_step_bwd", "compression_ratio_boundary")

# config field -> (the module it imports, the extra that installs it)
TRACKERS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}


class Sink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def write_summary(self, summary: dict[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def record_scalars(record: dict[str, Any]) -> dict[str, float]:
    """One metrics.jsonl record's numeric fields as ``train/<name>`` (the step itself left out)."""
    return {f"train/{k}": v for k, v in record.items() if k != "step" and _number(v)}


def summary_scalars(summary: dict[str, Any]) -> dict[str, float]:
    """The run's closing numbers, memory split by kind included, as ``summary/<name>``."""
    out = {f"summary/{k}": summary[k] for k in SUMMARY_KEYS if _number(summary.get(k))}
    for kind, value in (summary.get("mem_breakdown") or {}).items():
        if _number(value):
            out[f"summary/memory_{kind}_bytes"] = value
    return out


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
        from slimpar.train.tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(out_dir))
    if cfg.log.mlflow:
        from slimpar.train.mlflow_sink import MLflowSink

        sinks.append(MLflowSink(out_dir, cfg))
    return sinks
