"""The length and width sweeps of ``bench quality``: their rows, the paired gaps, the fit against scipy, the
verdicts and the extrapolation's interval against a hand computation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats

from benchmarks.quality import report as quality_report
from benchmarks.quality import rows as quality_rows
from benchmarks.quality import trends as quality_trends


def _run(group: str, row: str, seed: int, val: float) -> dict:
    return {"group": group, "row": row, "seed": seed, "command": "cmd", "curve": [],
            "summary": {"val_loss": val, "val_wikipedia_loss": None, "steps": 2000}}


def _sweep_done(tmp_path, sweep: str, names) -> None:
    from benchmarks.runner import Row

    for name in names:
        for lr in quality_rows.SWEEP_RATES[sweep]:
            folder = tmp_path / "runs" / Row(quality_rows.sweep_name(name, lr), quality_rows.CONFIG, group=sweep).key
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text(json.dumps({"val_loss": 3.0 + abs(float(lr) - 1e-3)}))


def test_length_and_width_rows_run_at_the_tuned_rates_and_reuse_the_tuned_runs(tmp_path):
    _sweep_done(tmp_path, "lr-sweep", quality_rows.TUNED)
    _sweep_done(tmp_path, "sdp-lr-sweep", quality_rows.SDP_TUNED)
    tuned = {r.key: r for r in quality_rows.rows(groups=("tuned", "sdp-tuned"), sweep_dir=tmp_path)}
    length = quality_rows.rows(groups=("length",), sweep_dir=tmp_path)
    # 3 seeds at each length, the longest's third only once the first two leave the gap unresolved (the test below)
    assert len(length) == len(quality_rows.LENGTH_ROWS) * (len(quality_rows.LENGTHS) * 3 - 1)
    assert quality_rows.LENGTHS[-1] / quality_rows.LENGTHS[0] >= 16  # the issue: at least 16x in tokens
    assert quality_rows.LENGTHS[-1] * 512 / 1_607_808 >= 10  # and >= 10 tokens per parameter for the larger (SDP) model
    for r in length:
        assert r.overrides[-2:] == ["--train.lr", "1e-3"] and r.overrides[1] == str(r.tags["steps"])
        if r.tags["steps"] == quality_rows.STEPS:  # the same command as the tuned run it reuses
            assert tuned[r.tags["same_as"]].overrides == r.overrides
        else:
            assert "same_as" not in r.tags
    width = quality_rows.rows(groups=("width",), sweep_dir=tmp_path)
    per_param = {r.tags["d"]: int(r.overrides[1]) * 512 / quality_rows.width_params(
        next(s for s, d in quality_rows.WIDTHS.items() if d == r.tags["d"])) for r in width}
    assert max(per_param.values()) == pytest.approx(min(per_param.values()), rel=0.01)  # equal tokens per parameter
    mid = [r for r in width if r.tags["d"] == 128]
    assert all(tuned[r.tags["same_as"]].overrides == r.overrides for r in mid)


def _longest(tmp_path, name: str, seed: int, val: float) -> None:
    from benchmarks.runner import Row

    row = Row(f"{name} at {quality_rows.LENGTHS[-1]} steps", quality_rows.CONFIG, group="length", seed=seed)
    (tmp_path / "runs" / row.key).mkdir(parents=True)
    (tmp_path / "runs" / row.key / "summary.json").write_text(json.dumps({"val_loss": val}))


def test_a_third_seed_runs_at_the_longest_length_only_where_two_leave_the_gap_unresolved(tmp_path):
    """2 seeds where their paired gaps' spread is under a quarter of the gap (by hand: SSN 4x's gaps 1% and 3%
    spread 1.41 points against a mean of 2%, MAPL 4x's 2.0% and 2.2% spread 0.14), and none wherever a row compared
    with it runs one; nothing until both first seeds and their baselines have finished."""
    _sweep_done(tmp_path, "lr-sweep", quality_rows.TUNED)
    _sweep_done(tmp_path, "sdp-lr-sweep", quality_rows.SDP_TUNED)
    k = quality_rows.LENGTHS[-1]

    def third() -> set[str]:
        return {r.name.rpartition(" at ")[0] for r in quality_rows.rows(groups=("length",), sweep_dir=tmp_path)
                if r.tags["steps"] == k and r.seed == 2}

    assert third() == set()  # the first two seeds have not run: no third yet
    for s, base in ((0, 4.0), (1, 3.9)):
        _longest(tmp_path, "none", s, base)
        _longest(tmp_path, "SSN 4x", s, base * (1.01 + 0.02 * s))
        _longest(tmp_path, "MAPL 4x", s, base * (1.02 + 0.002 * s))
        _longest(tmp_path, "DDP", s, base)
        _longest(tmp_path, "Bb-SDP 3/8", s, base * (1.05 + 0.01 * s))  # spread 0.71 points, a quarter of 5.5: 1.4
    assert third() == {"none", "SSN 4x"}
    losses = quality_rows.longest_losses(tmp_path)
    assert losses[("MAPL 4x", 1)] == pytest.approx(3.9 * 1.022)
    assert not quality_rows.third_seed(losses, "Bb-SDP 5/8")  # a row with no runs
    # where the run folders are gone, the committed results.json decides the same way
    runs = [{"group": "length", "row": f"{n} at {k} steps", "seed": s, "summary": {"val_loss": v}}
            for (n, s), v in losses.items()]
    other = tmp_path / "committed"
    other.mkdir()
    (other / "results.json").write_text(json.dumps({"runs": runs}))
    assert quality_rows.longest_losses(other) == losses


def test_gaps_pair_with_the_baseline_at_the_same_length_and_seed():
    runs = [_run("length", f"{row} at {k} steps", s, v * (1 + 0.01 * s)) for s in (0, 1)
            for row, k, v in (("none", 2000, 4.0), ("MAPL 4x", 2000, 4.2), ("none", 5000, 3.5), ("MAPL 4x", 5000, 3.6),
                              ("DDP", 2000, 3.9), ("Bb-SDP 3/8", 2000, 4.1))]
    pts = quality_trends.points(runs, "length")
    assert sorted(g for _, g in pts["MAPL 4x"]) == pytest.approx(sorted([0.05, 0.05, 0.1 / 3.5, 0.1 / 3.5]))
    assert [g for _, g in pts["Bb-SDP 3/8"]] == pytest.approx([4.1 / 3.9 - 1] * 2)  # against DDP, not none
    assert {x for x, _ in pts["MAPL 4x"]} == {math.log10(2000 * 512), math.log10(5000 * 512)}
    lines = quality_report.aggregate(runs)
    ln = next(x for x in lines if x["row"] == "MAPL 4x at 5000 steps")
    assert ln["val_loss_gap"] == pytest.approx(0.1 / 3.5)


def test_fit_equals_scipy_and_the_verdicts():
    pts = [(6.0, 0.05), (6.0, 0.06), (6.4, 0.04), (6.4, 0.045), (6.8, 0.03), (6.8, 0.028), (7.2, 0.01), (7.2, 0.02)]
    f = quality_trends.fit(pts)
    ref = stats.linregress([x for x, _ in pts], [y for _, y in pts])
    assert f["b"] == pytest.approx(ref.slope) and f["a"] == pytest.approx(ref.intercept)
    assert f["b_se"] == pytest.approx(ref.stderr) and f["verdict"] == "shrinks"
    assert quality_trends.fit([(x, -y) for x, y in pts])["verdict"] == "grows"
    flat = [(6.0, 0.01), (6.0, 0.03), (7.2, 0.02), (7.2, 0.01), (6.6, 0.03), (6.6, 0.01)]
    assert quality_trends.fit(flat)["verdict"] == "holds"
    assert quality_trends.fit(pts[:2]) is None  # one x: no slope


def test_the_extrapolation_interval_is_the_textbook_prediction_interval():
    pts = [(5.5, 0.06), (5.5, 0.05), (6.0, 0.04), (6.0, 0.045), (6.53, 0.03), (6.53, 0.035)]
    f = quality_trends.fit(pts)
    x0 = math.log10(150e6)
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    ref = stats.linregress(xs, ys)
    resid = [y - ref.intercept - ref.slope * x for x, y in pts]
    s = math.sqrt(sum(r * r for r in resid) / (len(pts) - 2))
    mx = sum(xs) / len(xs)
    half = stats.t.ppf(0.975, len(pts) - 2) * s * math.sqrt(1 + 1 / len(pts) + (x0 - mx) ** 2 /
                                                           sum((x - mx) ** 2 for x in xs))
    mid, got = quality_trends.predict(f, x0)
    assert mid == pytest.approx(ref.intercept + ref.slope * x0) and got == pytest.approx(half)


def test_the_report_has_the_sweep_tables_and_the_length_targets(tmp_path):
    runs = []
    for k, gap in zip(quality_rows.LENGTHS, (0.05, 0.04, 0.03, 0.02), strict=True):
        for s in (0, 1, 2):
            runs += [_run("length", f"none at {k} steps", s, 4.0 - 0.1 * s),
                     _run("length", f"MAPL 4x at {k} steps", s, (4.0 - 0.1 * s) * (1 + gap + 0.001 * s)),
                     _run("length", f"SSN 4x at {k} steps", s, (4.0 - 0.1 * s) * (1 + gap + 0.01))]
    lines = quality_report.aggregate(runs)
    t = quality_report.targets(lines)
    assert t["length sweep: MAPL 4x within 1% of none at the longest length"]["gap"] == pytest.approx(0.021)
    assert t["length sweep: MAPL 4x ahead of SSN 4x at every length"]["met"] is False  # lead 0.04 < spread
    meta = {"date": "d", "machine": "m", "cpus": 2, "git_commit": "c", "versions": {"torch": "2.13.0"}}
    md = quality_report.report_markdown(lines, meta, [], [], runs)
    assert "Length sweep:" in md and "| shrinks |" in md
    assert "| 16.38M tokens (8.5 passes) |" in md  # 32,000 steps of 512 tokens over the 1.93M-token split
    short = [r for r in runs if not r["row"].endswith(f" at {quality_rows.LENGTHS[-1]} steps")]
    md = quality_report.report_markdown(quality_report.aggregate(short), meta, [], [], short)
    assert "| shrinks |" not in md and "pending (3 of 4 points)" in md  # no verdict until every length has run
    one = [r for r in runs if r["seed"] == 0 or not r["row"].endswith(f" at {quality_rows.LENGTHS[-1]} steps")]
    md = quality_report.report_markdown(quality_report.aggregate(one), meta, [], [], one)
    assert "| shrinks |" not in md and "pending (1 point(s) with 1 seed)" in md  # nor on one seed of a length
    thin = quality_report.targets(quality_report.aggregate(one))
    assert all(v is None for k, v in thin.items() if k.startswith("length sweep") and "every length" not in k)
    ahead = thin["length sweep: MAPL 4x ahead of SSN 4x at every length"]  # missed at the 3 settled lengths
    assert ahead["met"] is False and ahead["lengths"] == (3, 4)
    partial = quality_report.targets(quality_report.aggregate(short))  # nor a target: a shorter length is not it
    assert all(v is None for k, v in partial.items() if k.startswith("length sweep") and "every length" not in k)
    quality_trends.plot(runs, "length", tmp_path)
    assert (tmp_path / "gap_vs_tokens.png").stat().st_size > 0


def test_two_seeds_at_the_longest_length_wait_for_a_third_where_their_spread_is_not_well_below_the_gap():
    """The rule that runs a third seed (quality_rows.third_seed) also keeps the verdict and the length targets
    pending until it has run: at 32,000 steps MAPL 4x's two seeds gave +2.19% and +0.86% (std 0.94 against a
    +1.53% mean); by hand, gaps 2% and 1% (std 0.71 > a quarter of 1.5) wait, 2% and 1.8% (0.14 <= 0.475) do not."""
    longest = quality_rows.LENGTHS[-1]

    def runs_with(last: tuple[float, float]) -> list[dict]:
        runs = []
        for k in quality_rows.LENGTHS:
            for s in (0, 1):
                gap = last[s] if k == longest else 0.05 - 0.01 * quality_rows.LENGTHS.index(k) + 0.001 * s
                runs += [_run("length", f"none at {k} steps", s, 4.0 - 0.1 * s),
                         _run("length", f"MAPL 4x at {k} steps", s, (4.0 - 0.1 * s) * (1 + gap)),
                         _run("length", f"SSN 4x at {k} steps", s, (4.0 - 0.1 * s) * 1.15)]
        return runs

    meta = {"date": "d", "machine": "m", "cpus": 2, "git_commit": "c", "versions": {"torch": "2.13.0"}}
    target = "length sweep: MAPL 4x within 1% of none at the longest length"
    wide = runs_with((0.02, 0.01))
    assert not quality_trends.settled([0.02, 0.01], longest=True) and quality_trends.settled([0.02, 0.01], False)
    assert quality_trends.settled([0.02, 0.01, 0.015], longest=True)  # the third has run
    lines = quality_report.aggregate(wide)
    assert quality_report.targets(lines)[target] is None
    assert quality_report.targets(lines)["length sweep: MAPL 4x ahead of SSN 4x at every length"] is None
    md = quality_report.report_markdown(lines, meta, [], [], wide)
    row = next(ln for ln in md.splitlines() if ln.startswith("| MAPL 4x |") and "passes" not in ln)
    assert "pending (a third seed at the longest length)" in row, row
    assert quality_rows.third_seed({("MAPL 4x", 0): 4.08, ("none", 0): 4.0, ("MAPL 4x", 1): 3.939, ("none", 1): 3.9},
                                   "MAPL 4x")  # the same rule asks the benchmark for the third seed
    behind = [dict(r, summary={**r["summary"], "val_loss": r["summary"]["val_loss"] * 1.2})
              if r["row"] == f"MAPL 4x at {quality_rows.LENGTHS[1]} steps" else r for r in wide]
    missed = quality_report.targets(quality_report.aggregate(behind))  # one settled length that misses it: missed
    every = missed["length sweep: MAPL 4x ahead of SSN 4x at every length"]
    assert every["met"] is False and every["lengths"] == (3, 4) and missed[target] is None
    md = quality_report.report_markdown(quality_report.aggregate(behind), meta, [], [], behind)
    assert "(worst of the 3 lengths settled of 4) | missed |" in md
    narrow = runs_with((0.02, 0.018))
    got = quality_report.targets(quality_report.aggregate(narrow))[target]
    assert got is not None and got["gap"] == pytest.approx(0.019) and got["met"] is False
    md = quality_report.report_markdown(quality_report.aggregate(narrow), meta, [], [], narrow)
    assert "pending (a third seed" not in md


def test_the_width_extrapolation_is_a_power_law_fitted_in_log_space():
    """gap = c·N^k through exact points gives back c·(150M)^k with a zero-width interval; a non-positive seed is
    left out and counted; the interval is scipy's prediction interval for ln gap, exponentiated."""
    c, k = 40.0, -0.45
    xs = [5.5, 6.0, 6.53]
    exact = [(x, c * (10 ** x) ** k) for x in xs for _ in range(2)]
    mid, low, high, dropped = quality_trends.power_law(exact, math.log10(150e6))
    assert mid == pytest.approx(c * 150e6 ** k) and low == pytest.approx(mid) and high == pytest.approx(mid)
    assert dropped == 0
    noisy = [(5.5, 0.06), (5.5, 0.05), (6.0, 0.04), (6.0, -0.001), (6.53, 0.03), (6.53, 0.035)]
    mid, low, high, dropped = quality_trends.power_law(noisy, math.log10(150e6))
    kept = [(x, math.log(g)) for x, g in noisy if g > 0]
    ref = stats.linregress([x for x, _ in kept], [y for _, y in kept])
    x0, n = math.log10(150e6), len(kept)
    mx = sum(x for x, _ in kept) / n
    s = math.sqrt(sum((y - ref.intercept - ref.slope * x) ** 2 for x, y in kept) / (n - 2))
    half = stats.t.ppf(0.975, n - 2) * s * math.sqrt(1 + 1 / n + (x0 - mx) ** 2 / sum((x - mx) ** 2 for x, _ in kept))
    centre = ref.intercept + ref.slope * x0
    assert dropped == 1 and mid == pytest.approx(math.exp(centre))
    assert (low, high) == (pytest.approx(math.exp(centre - half)), pytest.approx(math.exp(centre + half)))
    assert 0 < low < mid < high
    assert quality_trends.power_law(noisy[:2], x0) is None


def test_the_gap_during_training_pairs_each_width_with_its_own_baseline(tmp_path):
    """By hand: at d 64 the gap is 10% then 5%, at d 128 4% then 2% (each against none at its own width, seed by
    seed); the baselines get no curve of their own."""
    from benchmarks.quality.plots import gaps_during_training, plots

    def run(row, seed, vals):
        r = _run("width", row, seed, vals[-1])
        r["curve"] = [{"step": 250 * (i + 1), "val_loss": v, "loss": v} for i, v in enumerate(vals)]
        r["summary"]["steps"] = 250 * len(vals)
        return r

    runs = [run(f"none at d {d}", s, [b * (1 + s), b * (1 + s) / 2])
            for d, b in ((64, 5.0), (128, 4.0)) for s in (0, 1)]
    runs += [run("SSN 4x at d 64", s, [5.5 * (1 + s), 5.25 * (1 + s) / 2]) for s in (0, 1)]
    runs += [run("SSN 4x at d 128", s, [4.16 * (1 + s), 4.08 * (1 + s) / 2]) for s in (0, 1)]
    got = gaps_during_training(runs, "val_loss", quality_trends.baseline_name)
    assert set(got) == {"SSN 4x at d 64", "SSN 4x at d 128"}
    assert got["SSN 4x at d 64"][0] == [250, 500] and got["SSN 4x at d 64"][1] == pytest.approx([0.10, 0.05])
    assert got["SSN 4x at d 128"][1] == pytest.approx([0.04, 0.02])
    plots(runs, quality_report.aggregate(runs), tmp_path)
    assert (tmp_path / "gap_vs_step_width.png").read_bytes()[:4] == b"\x89PNG"


def test_the_passes_count_the_quality_configs_own_training_split():
    from slimpar.config import load_config
    from slimpar.data.text import build_text_data

    cfg = load_config(Path(quality_rows.__file__).parents[2] / quality_rows.CONFIG)
    assert build_text_data(cfg.data, seed=0).describe()["train_tokens"] == quality_trends.TRAIN_TOKENS
