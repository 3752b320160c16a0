"""Side-by-side step times over throttled links: real (netns + veth + tbf) and the send-side model.

For each link rate, every row runs once with one worker per network namespace, so the gradient (or
activation) traffic crosses rate-limited veths; the same row's unthrottled compute time and bytes
feed :func:`~benchmarks.network.links.simulated_step_time`, which also adds the latency the kernel here
cannot (no netem).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from benchmarks.network.links import LATENCY_NOTE, ThrottledNetwork, run_in_network, simulated_step_time
from benchmarks.report import fmt, markdown_table
from benchmarks.runner import CONFIGS, Row

LATENCY_S = 0.020
# throttled runs measure step time only (the median after warm-up): a short run, a token evaluation, no export
TIMING_ONLY = ["--train.steps", "16", "--eval.batches", "1", "--data.ood", "none", "--checkpoint.export", "false",
               "--checkpoint.final", "false"]


def run_throttled(rows: list[Row], rates_mbit: list[float], root: Path, world: int,
                  baseline: dict[str, dict], prefix: str = "spl") -> list[dict]:
    """Run every row at every rate; ``baseline`` maps row name -> its unthrottled summary. ``prefix`` names
    the network namespaces, so that two benchmarks can run at once."""
    if os.geteuid() != 0:
        return [{"error": "throttled links need root (network namespaces); only the simulator ran"}]
    out = []
    for rate in rates_mbit:
        for row in rows:
            run_dir = root / "throttled" / f"{row.key}-{int(rate)}mbit"
            path = run_dir / "summary.json"
            if path.exists():
                summary = json.loads(path.read_text())
            else:
                with ThrottledNetwork(world, rate, prefix=prefix) as net:
                    summary = run_in_network(net, str(CONFIGS / Path(row.config).name), run_dir,
                                             ["--log.progress", "false", *row.overrides, *TIMING_ONLY], world)
            out.append(_line(row, rate, summary, baseline.get(row.name, {})))
    return out


def _line(row: Row, rate: float, summary: dict, base: dict) -> dict:
    calls = sum((base.get("per_rank") or [{}])[0].get("comm_calls", {}).values()) if base else 0
    compute = base.get("step_time_s") or 0.0
    sent = base.get("wire_bytes_per_step") or base.get("comm_bytes_per_step") or 0.0
    return {"row": row.name, "rate_mbit": rate, "step_time_s": summary.get("step_time_s"),
            "unthrottled_step_time_s": compute, "wire_bytes_per_step": sent,
            "simulated_step_time_s": simulated_step_time(compute, sent, rate, 0.0, calls),
            "simulated_step_time_20ms_s": simulated_step_time(compute, sent, rate, LATENCY_S, calls),
            "val_loss": summary.get("val_loss")}


def throttled_markdown(lines: list[dict], reference: str) -> str:
    if lines and "error" in lines[0]:
        return f"Throttled links: {lines[0]['error']}.\n"
    headers = ["link", "row", "measured step time (s)", f"× {reference}", "simulated (s)", "simulated + 20 ms (s)"]
    ref = {ln["rate_mbit"]: ln["step_time_s"] for ln in lines if ln["row"] == reference}
    rows = [[f"{ln['rate_mbit']:g} Mbit/s", ln["row"], fmt(ln["step_time_s"], 3),
             fmt(ln["step_time_s"] / ref[ln["rate_mbit"]] if ref.get(ln["rate_mbit"]) else None, 2),
             fmt(ln["simulated_step_time_s"], 3), fmt(ln["simulated_step_time_20ms_s"], 3)] for ln in lines]
    return ("\n## Low-bandwidth links\n\nEach worker in its own network namespace; every veth is limited with `tbf` "
            f"in both directions. {LATENCY_NOTE}\n\n" + markdown_table(headers, rows) + "\n")
