"""``slimpar bench sdp --quick`` end to end: the report's structure and sane ratios (not timings)."""

import json
import math
import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.slow  # 140 s on 2 cores, like the quick mapl and quality benchmarks; the timing rounds' arithmetic
# and the mixed-commit note are unit-tested (tests/unit/test_bench_timing.py)
def test_quick_sdp_benchmark(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "-m", "slimpar", "bench", "sdp", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads((out / "results.json").read_text())
    assert {"date", "git_commit", "versions", "machine"} <= set(data["meta"])
    lines = {ln["row"]: ln for ln in data["lines"]}
    assert {"DDP", "B-SDP 0.5", "Bb-SDP 0.5"} <= set(lines)
    for ln in lines.values():
        assert math.isfinite(ln["val_loss"]) and ln["peak_mem_bytes"] > 0
    b = lines["B-SDP 0.5"]
    assert b["peak_mem_bytes_vs_ddp"] < 0.8  # half the blocks: parameters, gradients, state, activations
    assert b["comm_bytes_per_step"] == b["plan_floor_bytes"]  # exactly the plan's holder-group bytes
    assert b["comm_bytes_per_step_vs_ddp"] < 0.7
    assert lines["Bb-SDP 0.5"]["mem_breakdown"]["grads"] < lines["DDP"]["mem_breakdown"]["grads"]
    bb = lines["Bb-SDP 0.5"]  # refresh roots spread over the holders: no worker sends more than under DDP
    assert 0 < bb["comm_bytes_sent_per_step_max_vs_ddp"] < 1 and bb["comm_bytes_recv_per_step_max_vs_ddp"] < 1
    for ln in lines.values():
        assert ln["comm_bytes_sent_per_step_max"] >= ln["comm_bytes_sent_per_step_mean"] > 0
        assert ln["wire_bytes_per_step_max"] >= ln["wire_bytes_per_step"] > 0
    assert 0 < b["spectral_gap"] <= 1
    throttled = data["throttled"]
    assert {t["row"] for t in throttled} == {"DDP", "B-SDP 0.5"} and all(t["step_time_s"] > 0 for t in throttled)
    report = (out / "report.md").read_text()
    assert "| llama-tiny | B-SDP 0.5 |" in report and "Low-bandwidth links" in report
    assert "max sent / worker (MiB)" in report and "max received / worker (MiB)" in report
    for png in ("memory_llama-tiny.png", "loss_curves_llama-tiny.png", "loss_vs_memory_llama-tiny.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
