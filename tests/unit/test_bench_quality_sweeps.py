"""``slimpar bench quality``: its learning-rate and length sweeps, the tuned rows they choose, and the order and
resumption of its runs, against hand computations."""

import pytest

from benchmarks.quality import harness as quality
from benchmarks.quality import report as quality_report
from benchmarks.quality import rows as quality_rows
from tests.unit.test_bench_quality import _run


def _sweep_summary(tmp_path, name: str, lr: str, val: float, sweep: str = "lr-sweep") -> None:
    from benchmarks.runner import Row

    key = Row(quality_rows.sweep_name(name, lr), quality_rows.CONFIG, group=sweep).key
    folder = tmp_path / "runs" / key
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(f'{{"val_loss": {val}}}')


def test_the_sweep_runs_one_seed_per_rate_and_tuned_rows_take_the_best(tmp_path):
    sweep = quality_rows.rows(groups=("lr-sweep",))
    assert len(sweep) == len(quality_rows.TUNED) * len(quality_rows.LRS) and {r.seed for r in sweep} == {0}
    for r in sweep:  # the rate and, for the projecting codecs, matched total bytes and local ids
        lr = r.name.rpartition(" at lr ")[2]
        assert r.overrides[-2:] == ["--train.lr", lr]
        if "x" in r.name.split(" at lr ")[0]:
            assert "total" in r.overrides and "local" in r.overrides
    for name in quality_rows.TUNED:  # a valley: the best rate is 1e-3 for every row but SSN (2e-3)
        valley = (3.9, 3.7, 3.8, 4.2) if name != "SSN 4x" else (3.9, 3.8, 3.7, 4.2)
        for lr, v in zip(quality_rows.LRS, valley, strict=True):
            if not (name == "int8" and lr == "4e-3"):  # int8's sweep has not finished
                _sweep_summary(tmp_path, name, lr, v)
    best = quality_rows.best_rates(tmp_path)
    assert best == {n: "2e-3" if n == "SSN 4x" else "1e-3" for n in quality_rows.TUNED if n != "int8"}
    tuned = [r for r in quality_rows.rows(groups=("tuned",), sweep_dir=tmp_path) if r.group == "tuned"]
    assert {(r.name, r.seed) for r in tuned} == {(n, s) for n in best for s in (0, 1, 2)}
    for r in tuned:
        same = next(s for s in sweep if s.name == quality_rows.sweep_name(r.name, best[r.name]))
        assert r.overrides == same.overrides  # seed 0 of a tuned row is the sweep's run at its best rate
    with pytest.raises(Exception, match="run --rows lr-sweep to the end first"):
        quality.bench_quality(tmp_path, quick=False, only={"tuned"})
    sdp = quality_rows.rows(groups=("sdp-lr-sweep",))  # the SDP rows batched, DDP as it is
    assert {r.name.rpartition(" at lr ")[0] for r in sdp} == set(quality_rows.SDP_TUNED)
    assert all(("--sdp.virtual_batched" in r.overrides) != r.name.startswith("DDP") for r in sdp)


def test_the_sweep_table_marks_the_best_rate_and_an_edge():
    grid = (("none", (3.9, 3.7, 3.8, 4.0)), ("SSN 4x", (3.6, 3.7, 3.8, 4.0)))
    lines = [{"row": quality_rows.sweep_name(n, lr), "val_loss": v} for n, vals in grid
             for lr, v in zip(quality_rows.LRS, vals, strict=True)]
    table = quality_report.sweep_markdown(lines)
    none = next(ln for ln in table.splitlines() if ln.startswith("| none"))
    ssn = next(ln for ln in table.splitlines() if ln.startswith("| SSN 4x"))
    assert "**3.7000**" in none and none.rstrip(" |").endswith("no")
    assert "**3.6000**" in ssn and ssn.rstrip(" |").endswith("yes")  # best at the lowest rate: widen the sweep


def test_the_gap_on_each_half_is_paired_like_the_gap():
    runs = [_run("tuned", "none", s, 4.0) for s in (0, 1)] + [_run("tuned", "MAPL 4x", s, 4.04) for s in (0, 1)]
    for r, halves in zip(runs, [(4.0, 4.0), (3.9, 4.1), (4.08, 4.0), (3.9, 4.1)], strict=True):
        r["summary"]["val_loss_half1"], r["summary"]["val_loss_half2"] = halves
    line = next(ln for ln in quality_report.aggregate(runs) if ln["row"] == "MAPL 4x")
    assert line["val_loss_gap_halves"] == pytest.approx([0.01, 0.0])  # (0.02 + 0) / 2 on the first half


def _sweep_runner(trained: list):
    """A stand-in for runner.run_row whose best rate is 1e-3 for every row; it lists the runs it trains."""
    import json

    from benchmarks.runner import row_command

    def fake_run_row(row, root, timeout=0):
        folder = root / "runs" / row.key
        if not (folder / "summary.json").exists():
            trained.append((row.group, row.name, row.seed))
            folder.mkdir(parents=True)
            lr = float(row.overrides[row.overrides.index("--train.lr") + 1])
            val = 3.5 + abs(lr - 1e-3) * 100 + row.seed * 0.01
            (folder / "summary.json").write_text(json.dumps({"val_loss": val, "steps": 2000}))
        summary = json.loads((folder / "summary.json").read_text())
        return {"row": row.name, "group": row.group, "seed": row.seed, "tags": row.tags, "command": row_command(row),
                "summary": summary, "curve": [], "wall_s": None}

    return fake_run_row


def test_a_sweep_and_its_tuned_group_run_in_one_call_the_tuned_after(tmp_path, monkeypatch):
    """``--rows lr-sweep,tuned``: every sweep run first, then 3 seeds per row at its best rate, seed 0 reused."""
    trained = []
    monkeypatch.setattr(quality, "run_row", _sweep_runner(trained))
    monkeypatch.setattr(quality, "plots", lambda *a, **k: None)
    data = quality.bench_quality(tmp_path, quick=False, only={"lr-sweep", "tuned"})
    n_sweep = len(quality_rows.TUNED) * len(quality_rows.LRS)
    assert all(g == "lr-sweep" for g, _, _ in trained[:n_sweep])  # the whole sweep before any tuned run
    assert sorted(trained[n_sweep:]) == sorted(("tuned", n, s) for n in quality_rows.TUNED for s in (1, 2))
    tuned = [r for r in data["runs"] if r["group"] == "tuned"]
    assert len(tuned) == 3 * len(quality_rows.TUNED) and all(r["tags"]["lr"] == "1e-3" for r in tuned)
    assert not data["pending"] and not data["failed"]


def test_a_resumed_call_writes_the_report_once_per_phase_not_once_per_finished_run(tmp_path, monkeypatch):
    """Rewriting results.json and the plots after every finished run kept a resumed sweep from starting."""
    trained, writes = [], []
    monkeypatch.setattr(quality, "run_row", _sweep_runner(trained))
    monkeypatch.setattr(quality, "plots", lambda *a, **k: None)
    first = quality.bench_quality(tmp_path, quick=False, only={"lr-sweep", "tuned"})
    write = quality._write
    monkeypatch.setattr(quality, "_write", lambda *a: (writes.append(1), write(*a))[1])
    trained.clear()
    again = quality.bench_quality(tmp_path, quick=False, only={"lr-sweep", "tuned"})
    assert not trained and len(writes) == 3  # the sweep's phase, the tuned phase, the end
    assert again["lines"] == first["lines"] and len(again["runs"]) == len(first["runs"])


def test_the_default_set_is_the_core_set_and_one_rate_names_issue_10s_groups(tmp_path, monkeypatch):
    """No --rows: the sweeps, then (once they finish) the tuned rows; ``one-rate``: the six one-rate groups."""
    from benchmarks.quality import harness as quality
    from benchmarks.quality.rows import GROUPS, SWEEPS, rows

    monkeypatch.setattr(quality, "plots", lambda *a, **k: None)
    pending = quality.bench_quality(tmp_path / "a", quick=False, report_only=True)["pending"]
    sweeps = {g: len(rows(groups=(g,))) for g in SWEEPS}
    assert sweeps == {"lr-sweep": 20, "sdp-lr-sweep": 25}
    assert sorted(pending) == sorted(r.key for g in SWEEPS for r in rows(groups=(g,)))
    one_rate = quality.bench_quality(tmp_path / "b", quick=False, only={"one-rate"}, report_only=True)["pending"]
    assert sorted(one_rate) == sorted(r.key for r in rows(groups=GROUPS))
    assert {r.group for r in rows(groups=GROUPS)} <= set(GROUPS) and not set(one_rate) & set(pending)


def test_the_length_sweeps_third_seeds_run_last_and_only_where_needed(tmp_path, monkeypatch):
    """``--rows length``: every row's first two seeds at every length, then the third seeds at the longest length
    that quality_rows.third_seed asks for (here SSN 4x, whose seeds' gaps differ, and its baseline none)."""
    import json

    longest = quality_rows.LENGTHS[-1]
    for sweep, named in (("lr-sweep", quality_rows.TUNED), ("sdp-lr-sweep", quality_rows.SDP_TUNED)):
        for name in named:
            for lr in quality_rows.SWEEP_RATES[sweep]:
                _sweep_summary(tmp_path, name, lr, 3.0 + abs(float(lr) - 1e-3), sweep)
    trained = []

    def fake_run_row(row, root, timeout=0):
        folder = root / "runs" / row.key
        if not (folder / "summary.json").exists():
            trained.append((row.name, row.seed))
            head = row.name.rpartition(" at ")[0]
            gap = 0.0 if head in ("none", "DDP") else 0.01 + 0.02 * row.seed if head == "SSN 4x" else 0.02
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text(json.dumps({"val_loss": 3.5 * (1 + 0.01 * row.seed) * (1 + gap)}))
        return {"row": row.name, "group": row.group, "seed": row.seed, "tags": row.tags, "command": "cmd",
                "summary": json.loads((folder / "summary.json").read_text()), "curve": [], "wall_s": None}

    monkeypatch.setattr(quality, "run_row", fake_run_row)
    monkeypatch.setattr(quality, "plots", lambda *a, **k: None)
    data = quality.bench_quality(tmp_path, quick=False, only={"length"})
    n_rows = len(quality_rows.LENGTH_ROWS)
    assert len(trained) == n_rows * (3 * len(quality_rows.LENGTHS) - 1) + 2
    assert sorted(trained[-2:]) == [(f"SSN 4x at {longest} steps", 2), (f"none at {longest} steps", 2)]
    assert not data["pending"] and not data["failed"]
    line = next(ln for ln in data["lines"] if ln["row"] == f"MAPL 4x at {longest} steps")
    assert line["seeds"] == [0, 1] and line["val_loss_gap"] == pytest.approx(0.02)
    again = quality.bench_quality(tmp_path, quick=False, only={"length"}, report_only=True)
    assert len(again["runs"]) == len(data["runs"]) == len(trained)


def test_a_resumed_length_sweep_still_runs_third_seeds_after_every_rows_first_two(tmp_path):
    """Resumed where some rows' first two seeds at the longest length have finished (none, int8: their gaps
    spread, so a third is due) and others' have not: the third seeds still come after every first-two run (a
    resumed sweep at 911cc3a started none's and int8's third seeds before MAPL 4x's second)."""
    from benchmarks.runner import Row

    for sweep, named in (("lr-sweep", quality_rows.TUNED), ("sdp-lr-sweep", quality_rows.SDP_TUNED)):
        for name in named:
            for lr in quality_rows.SWEEP_RATES[sweep]:
                _sweep_summary(tmp_path, name, lr, 3.0 + abs(float(lr) - 1e-3), sweep)
    longest = quality_rows.LENGTHS[-1]
    for name, vals in (("none", (3.20, 3.21)), ("int8", (3.19, 3.21))):
        for seed, val in enumerate(vals):
            folder = tmp_path / "runs" / Row(f"{name} at {longest} steps", quality_rows.CONFIG, group="length",
                                             seed=seed).key
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text(f'{{"val_loss": {val}}}')
    runs = quality_rows.rows(groups=("length",), sweep_dir=tmp_path)
    third = [i for i, r in enumerate(runs) if r.seed == 2 and r.tags["steps"] == longest]
    assert [runs[i].name for i in third] == [f"none at {longest} steps", f"int8 at {longest} steps"]
    assert third == list(range(len(runs) - 2, len(runs)))  # last, after MAPL 4x's and the SDP rows' seed 1
    assert any(r.name == f"MAPL 4x at {longest} steps" and r.seed == 1 for r in runs)


def test_a_new_machine_goes_on_from_the_recorded_results_json(tmp_path, monkeypatch):
    """Run folders are not committed: a results.json copied into an empty --out is the record. Its runs are not
    trained again where their command is the same (a tuned seed 0 whose record is gone reuses the sweep run it
    repeats), a run whose command changed trains anew, and a call for one group keeps the other groups' records."""
    import json

    trained = []
    monkeypatch.setattr(quality, "run_row", _sweep_runner(trained))
    monkeypatch.setattr(quality, "plots", lambda *a, **k: None)
    first = quality.bench_quality(tmp_path / "a", quick=False, only={"lr-sweep", "tuned"})
    (tmp_path / "b").mkdir()
    record = json.loads((tmp_path / "a" / "results.json").read_text())
    record["runs"] = [r for r in record["runs"] if not (r["group"] == "tuned" and r["seed"] == 0)]
    changed = next(r for r in record["runs"] if r["group"] == "tuned" and r["row"] == "none" and r["seed"] == 1)
    changed["command"] += " --train.steps 10"
    (tmp_path / "b" / "results.json").write_text(json.dumps(record))
    trained.clear()
    again = quality.bench_quality(tmp_path / "b", quick=False, only={"tuned"})
    assert trained == [("tuned", "none", 1)]
    assert not (tmp_path / "b" / "runs" / "tuned-none-s0").exists()  # seed 0 came from the record
    assert quality_rows.best_rates(tmp_path / "b") == quality_rows.best_rates(tmp_path / "a")
    key = {(r["group"], r["row"], r["seed"]) for r in first["runs"]}
    assert {(r["group"], r["row"], r["seed"]) for r in again["runs"]} == key  # the sweep's records kept
    s0 = next(r for r in again["runs"] if r["group"] == "tuned" and r["row"] == "SSN 4x" and r["seed"] == 0)
    sweep = next(r for r in first["runs"] if r["row"] == quality_rows.sweep_name("SSN 4x", s0["tags"]["lr"]))
    assert s0["summary"] == sweep["summary"] and s0["tags"]["lr"] == "1e-3"
    assert again["lines"] == first["lines"] and not again["pending"]
