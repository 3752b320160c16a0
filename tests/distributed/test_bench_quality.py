"""``slimpar bench quality --quick`` end to end: real runs, gaps recomputed from their own summaries, reuse."""

import json
import math
import subprocess
import sys

import pytest

from slimpar.cli import main
from tests.helpers import ROOT


def _bench(out):
    return subprocess.run([sys.executable, "-m", "slimpar", "bench", "quality", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)


@pytest.mark.slow  # 140-150 s on 2 cores: the default suite keeps its budget (every quick benchmark is slow)
def test_quick_quality_benchmark_and_its_reuse(tmp_path):
    out = tmp_path / "bench"
    proc = _bench(out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads((out / "results.json").read_text())
    assert data["pending"] == [] and data["failed"] == []
    lines = {(ln["group"], ln["row"]): ln for ln in data["lines"]}
    assert set(lines) == {("sdp", "DDP"), ("sdp", "B-SDP 0.5"), ("mapl", "none"), ("mapl", "MAPL 4x + all changes")}
    runs = {(r["group"], r["row"], r["seed"]): r["summary"] for r in data["runs"]}
    for (group, row), ln in lines.items():
        assert ln["seeds"] == [0, 1] and ln["steps"] == 8
        assert math.isfinite(ln["val_loss"]) and math.isfinite(ln["val_wikipedia_loss"])
        base = "DDP" if group == "sdp" else "none"
        gaps = [runs[(group, row, s)]["val_loss"] / runs[(group, base, s)]["val_loss"] - 1 for s in (0, 1)]
        assert ln["val_loss_gap"] == pytest.approx(sum(gaps) / 2)
    # every run logged its validation loss on the way (eval.every), which the curves plot
    assert all(any("val_loss" in c for c in r["curve"]) for r in data["runs"])
    assert all(r["wall_s"] > 0 for r in data["runs"])  # uninterrupted runs are timed, for the time table
    report = (out / "report.md").read_text()
    assert "| B-SDP 0.5 iteration-matched within 1% of DDP |" in report and "| MAPL 4x + all changes |" in report
    for png in ("curves_sdp.png", "curves_mapl.png", "gaps_sdp.png", "gaps_mapl.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    # finished runs are reused: a second invocation trains nothing and reports the same numbers
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/summary.json")}
    again = _bench(out)
    assert again.returncode == 0, again.stderr[-4000:]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert json.loads((out / "results.json").read_text())["lines"] == data["lines"]
    # --report-only trains nothing and reports what finished: a run whose folder lost its summary is reported as
    # results.json recorded it; a run neither folder nor record holds is listed as not run
    gone = out / "runs" / "sdp-B-SDP_0.5-s1" / "summary.json"
    gone.unlink()
    assert main(["bench", "quality", "--quick", "--report-only", "--out", str(out)]) == 0
    kept = json.loads((out / "results.json").read_text())
    assert kept["pending"] == [] and kept["lines"] == data["lines"] and not gone.exists()
    kept["runs"] = [r for r in kept["runs"] if (r["group"], r["row"], r["seed"]) != ("sdp", "B-SDP 0.5", 1)]
    (out / "results.json").write_text(json.dumps(kept))
    assert main(["bench", "quality", "--quick", "--report-only", "--out", str(out)]) == 0
    partial = json.loads((out / "results.json").read_text())
    assert partial["pending"] == ["sdp-B-SDP_0.5-s1"] and not gone.exists()
    assert {ln["row"]: ln["seeds"] for ln in partial["lines"]}["B-SDP 0.5"] == [0]


def test_quality_benchmark_refuses_a_gpu_before_running(tmp_path, capsys):
    assert main(["bench", "quality", "--device", "cuda", "--out", str(tmp_path / "b")]) == 2
    assert "runs on CPU" in capsys.readouterr().err and not (tmp_path / "b").exists()
    assert main(["bench", "sdp", "--report-only", "--out", str(tmp_path / "b")]) == 2
    assert "--report-only applies to slimpar bench quality" in capsys.readouterr().err
