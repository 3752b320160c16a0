"""Step-time ratios of interleaved timing rounds (benchmarks/timing.py) against a hand computation, and the
mixed-commit note of bench reports."""

from benchmarks.report import commits_note, run_commits
from benchmarks.runner import Row
from benchmarks.timing import ratio_cell, step_time_ratios, timing_rows


def _run(row, t, seed=0, k=0, commit="a" * 40, load=1.0):
    return {"group": "g", "row": row, "seed": seed, "timing_round": k, "load_1m": load,
            "summary": {"step_time_s": t, "git_commit": commit}}


def test_rounds_rotate_the_order_and_only_shorten_the_runs():
    rows = [Row("DDP", "c", ["--train.steps", "50"], "g"), Row("B", "c", [], "g"), Row("C", "c", [], "g")]
    timed = timing_rows(rows, 2)
    assert [(r.timing_round, r.name) for r in timed] == [(1, "B"), (1, "C"), (1, "DDP"),
                                                          (2, "C"), (2, "DDP"), (2, "B")]
    ddp = timed[2]
    assert ddp.overrides[:2] == ["--train.steps", "50"] and ddp.overrides[2:4] == ["--train.steps", "6"]
    assert len({r.key for r in timed} | {r.key for r in rows}) == 9  # every run has its own folder


def test_a_row_sets_its_own_timing_length_and_environment():
    from benchmarks.runner import row_command

    row = Row("V", "c.toml", ["--train.steps", "40"], "g", timing_steps=40, env={"OMP_NUM_THREADS": "1"})
    (timed,) = timing_rows([row], 1)
    assert timed.overrides[2:4] == ["--train.steps", "40"] and timed.env == {"OMP_NUM_THREADS": "1"}
    assert row_command(timed).startswith("OMP_NUM_THREADS=1 slimpar train --config c.toml")


def test_ratios_are_taken_within_a_round():
    results = [_run("DDP", 2.0), _run("B", 1.0), _run("DDP", 4.0, seed=1), _run("B", 3.0, seed=1)]
    timings = [_run("DDP", 1.0, k=1, load=3.0), _run("B", 0.6, k=1), _run("DDP", 4.0, k=2), _run("B", 1.6, k=2)]
    ratios = step_time_ratios(results, timings, "DDP")
    b = ratios[("g", "B")]
    assert b["ratio"] == [0.5, 0.6, 0.4]  # round 0 uses the first seed only: 1/2, then 0.6/1, 1.6/4
    assert (b["ratio_median"], b["ratio_min"], b["ratio_max"], b["ratio_n"]) == (0.5, 0.4, 0.6, 3)
    assert ratios[("g", "DDP")]["ratio_median"] == 1.0 and ratios[("g", "DDP")]["load_1m"] == [1.0, 3.0, 1.0]
    assert ratio_cell(b) == "0.50 [0.40–0.60]" and ratio_cell(None) == "–"


def test_a_report_whose_runs_span_commits_says_so():
    runs = [_run("DDP", 1.0), _run("B", 1.0, commit="b" * 40), _run("C", 1.0)]
    assert run_commits(runs) == ["a" * 40, "b" * 40]
    note = commits_note({"run_commits": run_commits(runs)})
    assert "Mixed commits" in note and "`aaaaaaa`" in note and "`bbbbbbb`" in note
    assert commits_note({"run_commits": ["a" * 40]}) == ""


def test_tokens_per_s_against_ddp_from_the_step_time_ratios_and_the_batch():
    """The batch group (bench sdp, issue 20 item 2): tokens/s × DDP = (tokens a step / DDP's) / (step × DDP's),
    per round; a row at 4x DDP's batch whose steps take 2.5x, 2x and 3x as long moves 1.6, 2 and 1.33x the
    tokens a second."""
    from benchmarks.sdp import _tokens_per_step, batch_rows, tokens_per_s_vs_ddp

    ratio = {"ratio": [2.5, 2.0, 3.0]}
    got = tokens_per_s_vs_ddp({"tokens_per_step": 2048}, {"tokens_per_step": 512}, ratio)
    assert (got["ratio_median"], got["ratio_max"], got["ratio_n"]) == (1.6, 2.0, 3)
    assert abs(got["ratio_min"] - 4 / 3) < 1e-12
    assert tokens_per_s_vs_ddp({"tokens_per_step": None}, {"tokens_per_step": 512}, ratio) is None
    assert _tokens_per_step({"tokens_per_s": 1024 / 0.3, "step_time_s": 0.3}) == 1024
    assert _tokens_per_step({"tokens_per_s": None, "step_time_s": 0.3}) is None
    rows = batch_rows(100)
    assert [r.name for r in rows if r.name.startswith("DDP")] == ["DDP", "DDP at batch 16", "DDP at batch 32"]
    assert all(r.group == "batch" and "," not in r.name for r in rows)
    assert [r.overrides[r.overrides.index("--train.batch_size") + 1] for r in rows] == ["8", "16", "32"] * 2


def test_sdp_step_against_ddp_at_the_same_batch():
    """The batch table's cost column pairs round i of an SDP row with round i of DDP at its own batch size: steps
    of 0.16, 0.15, 0.18 s against DDP's 0.28, 0.30, 0.27 s give 4/7, 1/2 and 2/3 (median 4/7)."""
    from benchmarks.sdp import batch_markdown, same_batch_ratio

    def line(row: str, times: list[float]) -> dict:
        return {"group": "batch", "row": row, "tokens_per_step": 512, "step_time_s": times[0],
                "step_time": {"step_time_s": times}}

    batch = [line("DDP", [0.08, 0.08, 0.08]), line("DDP at batch 32", [0.28, 0.30, 0.27]),
             line("virtual B-SDP 0.5 batched at batch 32", [0.16, 0.15, 0.18])]
    got = same_batch_ratio(batch[2], batch)
    assert abs(got["ratio_median"] - 4 / 7) < 1e-12 and got["ratio_n"] == 3
    assert abs(got["ratio_min"] - 0.5) < 1e-12 and abs(got["ratio_max"] - 2 / 3) < 1e-12
    assert same_batch_ratio(batch[1], batch) is None  # DDP against itself is not a measurement
    assert "| 0.57 [0.50–0.67] |" in batch_markdown(batch)
