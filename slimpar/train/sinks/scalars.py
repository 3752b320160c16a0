"""Which numbers of a metrics line and of the summary every tracker sink logs (shared by the sinks)."""

from __future__ import annotations

from typing import Any

# summary.json keys logged once, at the last step (memory and bytes are measured on one instrumented step)
SUMMARY_KEYS = ("val_loss", "val_bits_per_byte", "val_wikipedia_loss", "val_accuracy", "peak_mem_bytes",
                "comm_bytes_per_step", "wire_bytes_per_step", "step_time_s", "tokens_per_s",
                "comm_bytes_per_step_fwd", "comm_bytes_per_step_bwd", "compression_ratio",
                "tied_bytes_per_step_fwd", "tied_bytes_per_step_bwd", "compression_ratio_boundary")

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
