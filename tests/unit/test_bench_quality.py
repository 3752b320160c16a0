"""``slimpar bench quality``: its rows, the seed-paired gaps and the targets, against hand computations."""

import statistics

import pytest

from benchmarks.quality import harness as quality
from benchmarks.quality import report as quality_report
from benchmarks.quality import rows as quality_rows
from benchmarks.runner import select_rows


def _run(group, row, seed, val, wiki=None, curve=(), wall_s=None):
    summary = {"val_loss": val, "val_wikipedia_loss": wiki, "train_loss": val + 0.1, "steps": 2000}
    return {"group": group, "row": row, "seed": seed, "command": f"{row} cmd", "summary": summary,
            "curve": list(curve), "wall_s": wall_s}


def test_every_row_the_issue_names_runs_with_three_seeds():
    rows = quality_rows.rows()
    names = {(r.group, r.name): [] for r in rows}
    for r in rows:
        names[(r.group, r.name)].append(r.seed)
    sdp = {"DDP", "B-SDP 0.5", "B-SDP 3/8", "N-SDP 0.5", "Bb-SDP 0.5", "Bb-SDP 3/8", "B-SDP 0.5 FLOP-matched"}
    mapl = {"none", "bf16", "int8", "naive 4x", "SSN 4x", "SSN 8x", "MAPL 4x", "MAPL 8x", "MAPL 4x + anchors",
            "MAPL 16x + RVQ", "MAPL 4x + PCA init", "MAPL 4x + own SPEL schedule", "MAPL 4x + separate clip",
            "MAPL 4x + zero anchors", "MAPL 4x + PCA + frozen after N", "MAPL 4x + all changes",
            "MAPL 16x (no RVQ)", "MAPL 8x + all changes", "MAPL 16x + RVQ + all changes",
            "MAPL 16x + all changes (no RVQ)", "MAPL 16x + RVQ + all changes - commitment",
            "MAPL 4x of every byte (default)"}
    assert {n for g, n in names if g == "sdp"} == sdp
    assert {n for g, n in names if g == "mapl"} == mapl
    assert {n for g, n in names if g == "mapl-deep"} >= {"none", "MAPL 4x", "SSN 4x"}
    assert {n for g, n in names if g == "resnet"} >= {"DDP", "B-SDP 0.5"}
    assert all(sorted(s) == [0, 1, 2] for s in names.values())
    for r in rows:
        args = " ".join(r.overrides)
        if r.group == "resnet":  # >= 3 epochs of Fashion-MNIST's 60,000 training images at batch 64
            assert int(r.overrides[r.overrides.index("--train.steps") + 1]) * 64 >= 3 * 60000
        else:
            assert "--train.steps 2000" in args
        if r.group == "sdp" and r.name != "DDP":
            assert "--sdp.virtual true" in args and "--sdp.virtual_workers 4" in args
        if r.group.startswith("mapl"):
            assert "--pipeline.virtual true" in args and "--pipeline.stages 4" in args
    frozen = next(r for r in rows if r.name == "MAPL 4x + PCA + frozen after N")
    assert frozen.overrides[frozen.overrides.index("--pipeline.freeze_projector_after") + 1] == "200"
    assert len(select_rows(rows, {"mapl/none/s1"})) == 1
    assert {r.group for r in select_rows(rows, {"resnet"})} == {"resnet"} and len(select_rows(rows, {"resnet"})) == 9
    half = [r for r in rows if r.group == "mapl-lr1e-3"]  # the half-learning-rate group differs only in its lr
    assert {r.name for r in half} >= {"none", "SSN 4x", "MAPL 4x + all changes"}
    for r in half:
        same = next(m for m in rows if m.group == "mapl" and m.name == r.name and m.seed == r.seed)
        assert r.overrides == same.overrides + ["--train.lr", "1e-3"]


def test_gaps_are_paired_by_seed_with_sample_std():
    base = [_run("sdp", "DDP", s, v, w) for s, v, w in ((0, 4.0, 5.0), (1, 4.4, 5.5), (2, 4.2, 5.2))]
    row = [_run("sdp", "B-SDP 0.5", s, v, w) for s, v, w in ((0, 4.04, 5.0), (1, 4.4, 5.61), (2, 4.158, 5.304))]
    lines = {ln["row"]: ln for ln in quality_report.aggregate(base + row)}
    gaps = [0.01, 0.0, -0.01]
    b = lines["B-SDP 0.5"]
    assert b["val_loss"] == pytest.approx(statistics.fmean([4.04, 4.4, 4.158]))
    assert b["val_loss_std"] == pytest.approx(statistics.stdev([4.04, 4.4, 4.158]))
    assert b["val_loss_gap"] == pytest.approx(0.0, abs=1e-12)
    assert b["val_loss_gap_std"] == pytest.approx(statistics.stdev(gaps))
    assert b["val_wikipedia_loss_gap"] == pytest.approx(statistics.fmean([0.0, 0.02, 0.02]))
    assert lines["DDP"]["val_loss_gap"] == 0 and lines["DDP"]["seeds"] == [0, 1, 2]


def test_a_seed_without_its_baseline_is_left_out_of_the_gap():
    runs = [_run("mapl", "none", 0, 4.0), _run("mapl", "MAPL 4x", 0, 4.2), _run("mapl", "MAPL 4x", 1, 9.0)]
    for r, fwd in zip(runs, (800.0, 180.0, 220.0), strict=True):
        r["summary"].update(comm_bytes_per_step_fwd=fwd, comm_bytes_per_step_bwd=fwd / 2)
    line = {ln["row"]: ln for ln in quality_report.aggregate(runs)}["MAPL 4x"]
    assert line["val_loss_gap"] == pytest.approx(0.05) and line["val_loss_gap_std"] is None
    assert line["comm_bytes_per_step_fwd_vs_base"] == pytest.approx(0.25)  # bytes: mean over seeds / baseline's
    assert line["comm_bytes_per_step_bwd_vs_base"] == pytest.approx(0.25)


def test_targets_met_and_missed():
    runs = [_run("mapl", n, s, v) for n, vals in {"none": (4.0, 4.1, 4.2), "MAPL 4x": (4.1, 4.2, 4.3),
                                                  "SSN 4x": (4.12, 4.22, 4.32), "naive 4x": (4.6, 4.7, 4.8)}.items()
            for s, v in enumerate(vals)]
    t = quality_report.targets(quality_report.aggregate(runs))
    # SSN leads by 0.02 nats, less than the two rows' std (0.1 each): not ahead by more than the spread
    ssn = t["MAPL 4x ahead of SSN 4x by more than the seed spread"]
    assert ssn["lead"] == pytest.approx(0.02) and ssn["spread"] == pytest.approx(0.2) and not ssn["met"]
    assert t["MAPL 4x ahead of naive 4x by more than the seed spread"]["met"]
    within = t["MAPL 4x within 1% of none (the paper's number)"]  # gaps 2.5%, 2.44%, 2.38%: std 0.06%
    assert within["gap"] > 0.01 and not within["met"] and not within["within_std"]
    assert t["B-SDP 0.5 iteration-matched within 1% of DDP"] is None  # rows not run are reported as such
    rvq = [_run("mapl", "MAPL 16x + RVQ", s, v) for s, v in enumerate((4.12, 4.26, 4.3))]
    # gaps +3.0%, +3.9%, +2.4%: +3.09% ± 0.77
    near = quality_report.targets(quality_report.aggregate(runs + rvq))["MAPL 16x + RVQ within 3% of none"]
    assert not near["met"] and near["within_std"]
    report = quality_report.report_markdown(quality_report.aggregate(runs + rvq), _meta(), ["sdp-DDP-s0"], [])
    assert "| MAPL 16x + RVQ within 3% of none | +3.09% ± 0.77 | missed by less than 1 std |" in report
    assert "| MAPL 4x ahead of naive 4x by more than the seed spread |" in report and "Not run yet (1 runs)" in report


def test_the_deep_target_compares_rows_of_its_own_group():
    shallow = [_run("mapl", n, s, v) for n, v in (("SSN 4x", 4.0), ("MAPL 4x + all changes", 4.5)) for s in (0, 1)]
    deep = [_run("mapl-deep", n, s, v + 0.01 * s) for n, v in (("SSN 4x", 4.3), ("MAPL 4x + all changes", 4.1))
            for s in (0, 1)]
    t = quality_report.targets(quality_report.aggregate(shallow + deep))
    # 8 blocks: lead 4.305 - 4.105 = 0.2 nats against a spread of 2 x std(4.30, 4.31) = 0.0141
    assert t["8 blocks: MAPL 4x + all changes ahead of SSN 4x"]["lead"] == pytest.approx(0.2)
    assert t["8 blocks: MAPL 4x + all changes ahead of SSN 4x"]["met"]
    assert t["MAPL 4x + all changes ahead of SSN 4x"]["lead"] == pytest.approx(-0.5)
    assert t["MAPL 8x + all changes ahead of SSN 8x"] is None
    assert t["lr 1e-3: MAPL 4x + all changes ahead of SSN 4x"] is None  # that group did not run


def test_the_half_learning_rate_targets_read_their_own_group():
    runs = [_run("mapl-lr1e-3", n, s, v + 0.02 * s) for n, v in (("none", 4.0), ("SSN 4x", 4.2),
            ("MAPL 4x + all changes", 4.1), ("MAPL 16x + RVQ + all changes", 4.16)) for s in (0, 1)]
    runs += [_run("mapl", "SSN 4x", s, 3.0) for s in (0, 1)]  # the other group's rows must not be read
    t = quality_report.targets(quality_report.aggregate(runs))
    ahead = t["lr 1e-3: MAPL 4x + all changes ahead of SSN 4x"]
    assert ahead["lead"] == pytest.approx(0.1) and ahead["spread"] == pytest.approx(2 * 0.02 / 2 ** 0.5)
    assert ahead["met"]
    # gaps 4.16 / 4.0 - 1 = 4.0% and 4.18 / 4.02 - 1 = 3.98%: missed
    assert not t["lr 1e-3: MAPL 16x + RVQ + all changes within 3% of none"]["met"]
    assert t["lr 1e-3: MAPL 8x + all changes ahead of SSN 8x"] is None


def test_the_curve_gives_the_last_quarter_drop_and_the_tail_training_loss():
    curve = [{"step": 1500, "val_loss": 4.5, "loss": 9.0}, {"step": 1750, "val_loss": 4.45, "loss": 9.0},
             {"step": 1800, "loss": 4.0}, {"step": 1900, "loss": 4.2}, {"step": 2000, "loss": 4.4}]
    line = quality_report.aggregate([_run("sdp", "DDP", 0, 4.4, curve=curve)])[0]
    assert line["val_drop_last_quarter"] == pytest.approx(0.1)
    assert line["train_loss"] == pytest.approx(4.3)  # steps 1900 and 2000: the last 10% of 2000


def test_parameter_counts_match_a_hand_count():
    d, kv, ffn, vocab = 128, 64, 352, 1024
    block = 2 * d * d + 2 * d * kv + 3 * d * ffn + 2 * d
    assert quality_report.n_params("mapl") == 2 * vocab * d + 4 * block + d  # untied embeddings in the pipeline
    assert quality_report.n_params("sdp") == vocab * d + 8 * block + d
    assert quality_report.n_params("resnet") is None


def _meta():
    return {"date": "d", "machine": "m", "cpus": 2, "git_commit": "c", "versions": {"torch": "t"}}


def test_no_row_name_has_a_comma():
    """``--rows`` splits on commas, so a row name with one could never be selected."""
    from benchmarks import mapl, sdp

    names = [r.name for r in quality_rows.rows()] + [r.name for r in mapl.rows(False)]
    names += [r.name for r in sdp.llama_rows("configs/llama_small.toml", 10, (0, 1))]
    names += [r.name for r in sdp.resnet_rows(10)]
    assert names and not [n for n in names if "," in n]


def test_the_time_table_sums_the_fastest_run_times_per_group():
    runs = [_run("sdp", "DDP", 0, 4.0, wall_s=600), _run("sdp", "DDP", 1, 4.0, wall_s=1200),
            _run("sdp", "DDP", 2, 4.0, wall_s=6000),  # the fastest, 10 min, times 3 seeds: 0.5 h
            _run("mapl", "none", 0, 4.0, wall_s=None), _run("mapl", "none", 1, 4.0, wall_s=3600)]  # 60 min x 2
    lines = quality_report.aggregate(runs)
    assert [ln["minutes_per_run"] for ln in lines] == [pytest.approx(10), pytest.approx(60)]
    text = quality_report.report_markdown(lines, {**_meta(), "jobs": 2}, [], [])
    time = text.split("## Time")[1]
    assert "| sdp | 0.50 | 0.25 |" in time and "| mapl | 2.00 | 1.00 |" in time and "| all | 2.50 | 1.25 |" in time
    untimed = quality_report.aggregate([_run("sdp", "DDP", 0, 4.0)])
    assert "## Time" not in quality_report.report_markdown(untimed, _meta(), [], [])


def test_the_gap_during_training_is_plotted_only_where_it_was_evaluated_during_training(tmp_path):
    from benchmarks.quality.plots import plots

    def curve(*vals):
        return [{"step": 250 * (i + 1), "val_loss": v, "loss": v} for i, v in enumerate(vals)]

    runs = [_run("sdp", "DDP", 0, 4.0, curve=curve(5.0, 4.0)), _run("sdp", "B-SDP 0.5", 0, 4.4, curve=curve(5.5, 4.4)),
            _run("mapl", "none", 0, 4.0, curve=[{"step": 25, "loss": 6.0}]),  # evaluated at the end only
            _run("mapl", "MAPL 4x", 0, 4.2, curve=[{"step": 25, "loss": 6.1}])]
    plots(runs, quality_report.aggregate(runs), tmp_path)
    assert (tmp_path / "gap_vs_step_sdp.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "gap_vs_step_mapl.png").exists() and (tmp_path / "curves_mapl.png").exists()


def test_report_only_rebuilds_the_committed_report_from_results_json(tmp_path, monkeypatch):
    """Run folders are not committed: --report-only takes the runs results.json recorded, gives the same
    lines and targets, and names the commits the runs ran at."""
    import json
    import shutil

    from benchmarks.quality import harness as quality
    from tests.helpers import ROOT

    shutil.copy(ROOT / "docs/results/quality/results.json", tmp_path / "results.json")
    committed = json.loads((tmp_path / "results.json").read_text())
    monkeypatch.setattr(quality, "plots", lambda *a, **k: None)  # the figures are not what this checks
    data = quality.bench_quality(tmp_path, quick=False, only={"one-rate"}, report_only=True)
    assert data["lines"] == committed["lines"]
    assert {k: data["targets"].get(k) for k in committed["targets"]} == committed["targets"]
    assert all(v is None for k, v in data["targets"].items() if k not in committed["targets"])  # added since: not run
    assert not data["pending"] and len(data["runs"]) == len(committed["runs"])
    commits = {r["summary"]["git_commit"] for r in committed["runs"]}
    assert set(data["meta"]["run_commits"]) == commits and len(commits) > 1
    assert f"the rows ran on {len(commits)} commits" in (tmp_path / "report.md").read_text()


def test_a_long_run_s_curve_is_thinned_keeping_every_evaluation():
    """A 32,000-step run logs 1,280 points every 25 steps, an evaluation every 250: results.json keeps 256
    evenly strided training points, every evaluation and the last point; a 250-point curve is left whole."""
    curve = [{"step": 25 * (i + 1), "loss": 4.0 - i / 1e3} for i in range(1280)]
    for c in curve[9::10]:
        c["val_loss"] = c["loss"] + 0.1
    got = quality.thin({"curve": curve})["curve"]
    assert [c["step"] for c in got if "val_loss" in c] == list(range(250, 32001, 250))
    assert [c["step"] for c in got] == list(range(125, 32001, 125)) and got[-1] is curve[-1]
    short = {"curve": curve[:250]}
    assert quality.thin(short) is short


def test_the_mapl_table_compares_k_of_every_byte_with_r_d_over_k():
    """The note under the mapl table: the default MAPL 4x's paired gap, r and bytes against the r = d / K row's."""
    runs = [_run("mapl", "none", s, 4.0) for s in (0, 1)]
    for name, vals, rank, frac in ((quality_report.PAYLOAD_ROW, (4.16, 4.2), None, 0.3),
                                   (quality_report.EVERY_BYTE, (4.2, 4.24), 29, 0.243)):
        for s, v in enumerate(vals):
            run = _run("mapl", name, s, v)
            run["summary"].update(bytes_fraction_fwd=frac, bytes_fraction_bwd=frac - 0.004, git_commit="abcdef012",
                                  **({"pipeline_rank": rank} if rank else {}))
            runs.append(run)
    lines = quality_report.aggregate(runs)
    assert quality_report.every_byte_note(lines, runs[:4]) == ""  # the default row has not run
    note = quality_report.every_byte_note(lines, runs)
    assert "r = 29) sends 0.243/0.239 of none's bytes" in note and "+5.50% ± 0.71 above none" in note
    assert "+4.50% ± 0.71 for MAPL 4x + all changes (r = d / K" in note and "0.300/0.296 of none's bytes" in note
    assert "+1.00 points, within the two seed spreads summed (1.41)" in note and "`abcdef0`" in note
    assert note in quality_report.report_markdown(lines, {**_meta(), "jobs": 2}, [], [], runs)
