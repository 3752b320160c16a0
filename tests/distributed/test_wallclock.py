"""``slimpar bench wallclock``'s model and report, on synthetic measurements (no namespaces, a few seconds).

The sweep itself (two namespaces, tbf, 32 torchrun jobs) takes tens of minutes: it is run by hand with
``slimpar bench wallclock --out docs/results/wallclock`` and its result is kept under docs/results/wallclock.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.network import wallclock
from benchmarks.network.wallclock import crossover, fit_row, paper_predictions, predict


def synthetic(compute: float, nbytes: float, rates=(1000.0, 100.0, 10.0, 1.0)) -> list[tuple[float, float, float]]:
    return [(r, compute + nbytes * 8 / (r * 1e6), nbytes) for r in rates]


def test_fit_recovers_compute_and_bytes():
    f = fit_row(synthetic(0.3, 250_000))
    assert f["compute_s"] == pytest.approx(0.3) and f["bytes"] == 250_000 and f["rms_rel"] < 1e-9
    assert f["compute_free_s"] == pytest.approx(0.3) and f["bytes_eff"] == pytest.approx(250_000)
    assert predict(f, 10.0) == pytest.approx(0.3 + 0.2)


def test_crossover_is_where_the_fitted_lines_meet():
    none = fit_row(synthetic(0.2, 1_000_000))
    codec = fit_row(synthetic(0.3, 250_000))  # more compute, 4x fewer bytes
    x = crossover(codec, none)
    assert x["pays"] == "below"
    assert predict(codec, x["mbit"]) == pytest.approx(predict(none, x["mbit"]))  # 60 Mbit/s
    assert x["mbit"] == pytest.approx(60.0)
    assert crossover(fit_row(synthetic(0.1, 1)), none)["pays"] == "always"
    assert crossover(fit_row(synthetic(0.3, 2_000_000)), none)["pays"] == "never"


def test_report_plot_and_paper_predictions(tmp_path, monkeypatch):
    truth = {"DDP": ("sdp", 0.2, 2e6), "FSDP2": ("sdp", 0.25, 3e6), "B-SDP 0.5 + FSDP2": ("sdp", 0.22, 1e6),
             "none": ("mapl", 0.3, 4e5), "MAPL 4x": ("mapl", 0.35, 1e5)}
    lines = [{"family": fam, "row": name, "rate_mbit": r, "step_time_s": t, "bytes_per_step": b}
             for name, (fam, c, nb) in truth.items() for r, t, b in synthetic(c, nb)]

    def fake_run(family, name, overrides, rate, steps, root):
        return next(ln for ln in lines if ln["row"] == name and ln["rate_mbit"] == rate)

    monkeypatch.setattr(wallclock, "run_one", fake_run)
    data = wallclock.bench_wallclock(tmp_path, only=set(truth))
    assert (tmp_path / "wallclock.png").stat().st_size > 10_000
    report = (tmp_path / "report.md").read_text()
    assert "netem" in report and "MAPL 4x" in report and "pays below" in report
    assert json.loads((tmp_path / "results.json").read_text())["fits"]["DDP"]["compute_s"] == pytest.approx(0.2)
    paper = {p["row"]: p for p in data["paper"]["rows"]}
    # DDP at 1 Gbit/s: 1.2e9 fp32 gradients each way = 4.8 GB -> 38.4 s plus 0.59 s of compute
    assert paper["DDP"]["step_time_s"] == pytest.approx(0.59 + 38.4, abs=0.01)
    assert paper["B-SDP 0.5 + FSDP2"]["bytes"] == pytest.approx(paper["DDP"]["bytes"] / 2)
    assert paper["MAPL 4x"]["vs_reference"] < 0.3
    assert paper_predictions({}) == []
