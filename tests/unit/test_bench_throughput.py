"""``slimpar bench throughput``: a tiny CPU run writes valid rows, results.json and report.md."""

import json
import math

from benchmarks.throughput import PIPELINE_ROWS, TRAIN_ROWS, TRAINER_ROWS, bench_throughput


def test_a_tiny_cpu_run_writes_valid_rows(tmp_path):
    data = bench_throughput(tmp_path, "tiny", "cpu", quick=True, backend="eager", train_rows=TRAINER_ROWS)
    lines = {ln["row"]: ln for ln in data["lines"]}
    assert list(lines) == ["plain eager", "plain compiled", *TRAINER_ROWS]
    for ln in lines.values():
        assert ln["step_time_s"] > 0 and math.isclose(ln["tokens_per_s"], 8 * 64 / ln["step_time_s"])
        assert ln["aten_ops"] > 0 and ln["mfu"] is None  # a CPU has no peak in the table
    assert lines["plain compiled"]["ratio_to_plain_compiled"] == 1.0
    assert lines["train compiled"]["compile"]["graph_breaks"] == 0
    assert data["meta"]["mfu_note"] == "cpu" and data["meta"]["git_commit"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [ln["row"] for ln in saved["lines"]] == list(lines)
    report = (tmp_path / "report.md").read_text()
    assert all(f"| {name} |" in report for name in lines)


def test_the_virtual_pipeline_rows(tmp_path):
    """The virtual pipeline rows (a run of their own, to keep each test short): one process each, aten ops counted,
    a codec costing ops on top of the uncompressed pipeline's."""
    assert set(TRAIN_ROWS) == {*TRAINER_ROWS, *PIPELINE_ROWS}
    data = bench_throughput(tmp_path, "tiny", "cpu", quick=True, backend="eager", train_rows=PIPELINE_ROWS)
    lines = {ln["row"]: ln for ln in data["lines"]}
    assert list(lines) == ["plain eager", "plain compiled", *PIPELINE_ROWS]
    none, mapl, rvq = (lines[name]["aten_ops"] for name in PIPELINE_ROWS)
    assert 0 < none < mapl < rvq
    assert all(lines[name]["step_time_s"] > 0 and lines[name]["peak_mem_bytes"] for name in PIPELINE_ROWS)
    report = (tmp_path / "report.md").read_text()
    assert all(f"| {name} |" in report for name in PIPELINE_ROWS)
