"""Optional TensorBoard sink (``log.tensorboard = true``): the numbers of ``metrics.jsonl`` and
``summary.json`` as scalars under ``OUT/tensorboard``, written by rank 0 with torch's SummaryWriter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slimpar.train.sinks.scalars import record_scalars, summary_scalars


class TensorBoardSink:
    def __init__(self, out_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        """One metrics.jsonl record: every numeric field as ``train/<name>`` at its step."""
        for tag, value in record_scalars(record).items():
            self.writer.add_scalar(tag, value, record["step"])

    def write_summary(self, summary: dict[str, Any], step: int) -> None:
        """The run's closing numbers as ``summary/<name>`` at the last step."""
        for tag, value in summary_scalars(summary).items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
