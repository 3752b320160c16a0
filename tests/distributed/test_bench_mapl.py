"""``slimpar bench mapl --quick`` end to end: the report's structure and sane ratios (not timings)."""

import json
import math
import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.slow  # 140-150 s on 2 cores: the default suite keeps its budget (every quick benchmark is slow)
def test_quick_mapl_benchmark(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "-m", "slimpar", "bench", "mapl", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads((out / "results.json").read_text())
    assert {"date", "git_commit", "versions", "machine"} <= set(data["meta"])
    lines = {ln["row"]: ln for ln in data["lines"]}
    assert set(lines) == {"none", "MAPL 4x", "MAPL 16x + RVQ"}
    for ln in lines.values():
        assert math.isfinite(ln["val_loss"]) and ln["step_time_s"] > 0
    # the uncompressed row is the reference of every ratio
    assert lines["none"]["fwd_bytes_vs_none"] == lines["none"]["bwd_bytes_vs_none"] == 1
    mapl = lines["MAPL 4x"]  # payload plus the counted A-gradient exchange
    assert 0.25 < mapl["fwd_bytes_vs_none"] <= 0.26 and 0.25 < mapl["bwd_bytes_vs_none"] <= 0.26
    rvq = lines["MAPL 16x + RVQ"]  # packed indices forward, r floats backward
    assert rvq["bwd_bytes_vs_none"] == pytest.approx(1 / 16, abs=0.01)
    # the indices are a few bytes per token; the codebook rows the EMA changed travel too, and at this
    # tiny batch (512 tokens a step) a codebook in use changes most of its rows every step
    fwd = {part: sum(b["fwd"][part] for b in rvq["breakdown"].values()) for part in ("payload", "codebook", "sync")}
    assert fwd["payload"] < 0.05 * lines["none"]["fwd_bytes"] and fwd["codebook"] > 0
    assert sum(sum(b["fwd"].values()) for b in rvq["breakdown"].values()) == pytest.approx(rvq["fwd_bytes"])
    assert 0 < mapl["max_orth_error"] <= 1e-5 and 0 < mapl["spel_time_share"] < 1
    assert lines["none"]["max_orth_error"] == 0
    report = (out / "report.md").read_text()
    assert "| MAPL 4x |" in report and "Low-bandwidth links" in report
    throttled = data["throttled"]
    assert {t["row"] for t in throttled} == {"none", "MAPL 4x"} and all(t["step_time_s"] > 0 for t in throttled)
    assert (out / "pareto_mapl.png").read_bytes()[:4] == b"\x89PNG"
