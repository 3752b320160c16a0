"""Optional TensorBoard sink (``log.tensorboard = true``): the numbers of ``metrics.jsonl`` and
``summary.json`` as scalars under ``OUT/tensorboard``, written by rank 0 with torch's SummaryWriter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# summary.json keys logged once, at the last step (memory and bytes are measured on one instrumented step)
SUMMARY_KEYS = ("val_loss", "val_bits_per_byte", "val_wikipedia_loss", "val_accuracy", "peak_mem_bytes",
                "comm_bytes_per_step", "wire_bytes_per_step", "step_time_s", "tokens_per_s",
                "comm_bytes_per_step_fwd", "comm_bytes_per_step_bwd", "compression_ratio")


def tensorboard_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


class TensorBoardSink:
    def __init__(self, out_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        """One metrics.jsonl record: every numeric field as ``train/<name>`` at its step."""
        step = record["step"]
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"train/{key}", value, step)

    def write_summary(self, summary: dict[str, Any], step: int) -> None:
        """The run's closing numbers, memory split by kind included, as ``summary/<name>``."""
        for key in SUMMARY_KEYS:
            value = summary.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"summary/{key}", value, step)
        for kind, value in (summary.get("mem_breakdown") or {}).items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(f"summary/memory_{kind}_bytes", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
