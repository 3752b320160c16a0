"""``slimpar bench throughput``: a tiny CPU run writes valid rows, results.json and report.md."""

import json
import math

import pytest
import torch

from benchmarks import throughput
from benchmarks.throughput import (
    BOUNDARY_ROWS,
    PIPELINE_ROWS,
    TRAIN_ROWS,
    TRAINER_ROWS,
    Shape,
    bench_throughput,
    parse_rows,
    plain_row,
    row_names,
)
from slimpar.config import ConfigError

PLAIN = ("plain eager", "plain compiled")


def test_a_tiny_cpu_run_writes_valid_rows(tmp_path):
    data = bench_throughput(tmp_path, "tiny", "cpu", quick=True, backend="eager",
                            rows=(*PLAIN, "boundary", *TRAINER_ROWS))
    lines = {ln["row"]: ln for ln in data["lines"]}
    assert list(lines) == ["plain eager", "plain compiled", *BOUNDARY_ROWS, *TRAINER_ROWS]
    for ln in lines.values():
        assert ln["step_time_s"] > 0 and math.isclose(ln["tokens_per_s"], 8 * 64 / ln["step_time_s"])
        assert ln["aten_ops"] > 0 and ln["mfu"] is None  # a CPU has no peak in the table
    assert lines["MAPL boundary step"]["aten_ops"] < lines["plain eager"]["aten_ops"] / 5  # one boundary, no blocks
    assert lines["plain compiled"]["ratio_to_plain_compiled"] == 1.0
    assert lines["train compiled"]["compile"]["graph_breaks"] == 0
    assert data["meta"]["mfu_note"] == "cpu" and data["meta"]["git_commit"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [ln["row"] for ln in saved["lines"]] == list(lines)
    report = (tmp_path / "report.md").read_text()
    assert all(f"| {name} |" in report for name in lines)
    assert "MAPL boundary step: d = 64, r = 16, 512 tokens;" in report


def test_the_virtual_pipeline_rows(tmp_path):
    """The virtual pipeline rows (a run of their own, to keep each test short): one process each, aten ops counted,
    a codec costing ops on top of the uncompressed pipeline's."""
    assert set(TRAIN_ROWS) == {*TRAINER_ROWS, *PIPELINE_ROWS}
    data = bench_throughput(tmp_path, "tiny", "cpu", quick=True, backend="eager", rows=(*PLAIN, *PIPELINE_ROWS))
    lines = {ln["row"]: ln for ln in data["lines"]}
    assert list(lines) == ["plain eager", "plain compiled", *PIPELINE_ROWS]
    none, mapl, rvq = (lines[name]["aten_ops"] for name in PIPELINE_ROWS)
    assert 0 < none < mapl < rvq
    assert all(lines[name]["step_time_s"] > 0 and lines[name]["peak_mem_bytes"] for name in PIPELINE_ROWS)
    report = (tmp_path / "report.md").read_text()
    assert all(f"| {name} |" in report for name in PIPELINE_ROWS)


def test_a_failing_row_is_recorded_the_others_run_and_results_follow_every_row(tmp_path, monkeypatch):
    """A row that raises (a compile mode or a size a new machine rejects) leaves an error, not a lost run."""
    real, seen = throughput.plain_row, []

    def plain(shape, device, backend, mode=None):
        if seen:  # results.json already holds every row before this one
            assert [ln["row"] for ln in json.loads((tmp_path / "results.json").read_text())["lines"]] == seen
        seen.append("plain eager" if backend is None else "plain compiled")
        if backend is None:
            raise RuntimeError("CUDA out of memory")  # one line, as the table needs
        return real(shape, device, backend, mode)

    monkeypatch.setattr(throughput, "plain_row", plain)
    data = bench_throughput(tmp_path, "tiny", "cpu", quick=True, backend="eager", rows=PLAIN)
    failed, ok = data["lines"]
    assert failed["error"] == "RuntimeError: CUDA out of memory" and failed["step_time_s"] is None
    assert ok["step_time_s"] > 0 and ok["ratio_to_plain_compiled"] == 1.0
    assert "| plain eager | failed: RuntimeError: CUDA out of memory |" in (tmp_path / "report.md").read_text()
    assert throughput._cell("a |\n b") == "a / b"  # a traceback's lines and pipes stay in their cell


def test_rows_are_checked_before_anything_is_written(tmp_path):
    assert row_names("cpu") == [*PLAIN, *BOUNDARY_ROWS, *TRAIN_ROWS]  # CUDA graphs only where inductor records them
    assert row_names("cuda") == [*PLAIN, "plain compiled, CUDA graphs", *BOUNDARY_ROWS, *TRAIN_ROWS]
    assert row_names("cuda", ["boundary", "train eager"]) == [*BOUNDARY_ROWS, "train eager"]  # the device call's
    for bad in (("plain compiled, CUDA graphs",), ("train fast",)):
        with pytest.raises(ConfigError, match="has no row"):
            bench_throughput(tmp_path / "x", "tiny", "cpu", rows=bad)
    assert not (tmp_path / "x").exists()
    assert parse_rows("train eager, train compiled, loss,pipeline") == ["train eager", "train compiled, loss",
                                                                         "pipeline"]
    assert parse_rows("plain compiled, CUDA graphs") == ["plain compiled, CUDA graphs"] and parse_rows("") is None


def test_the_cuda_graphs_loop_opens_each_step(monkeypatch):
    """The CUDA graphs row marks every step's start (else a graph's outputs are overwritten under the next step);
    on a CPU inductor runs the blocks without graphs, so the loop itself is what is checked here."""
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    shape = Shape("tiny", 2, 16, 64, warmup=1, steps=2)
    r = plain_row(shape, torch.device("cpu"), "eager", "reduce-overhead")
    assert r["step_time_s"] > 0 and len(marks) == 1 + 2 + 1  # warm-up, measured steps, the counted step


def test_rounds_interleave_the_rows_and_take_each_ratio_within_a_round(tmp_path, monkeypatch):
    """Without --quick every row runs in 3 rounds, the order rotated by one each round; a row's step is its median
    over the rounds and its ratio the median [min-max] of its ratios to the plain compiled loop of the same round
    (a slow round moves both, and the ratio less); numbers by hand below."""
    times = {"plain compiled": [1.0, 2.0, 1.0], "train eager": [1.5, 2.0, 1.2], "MAPL boundary step": [0.1, 0.2, 0.3]}
    order = []

    def measure(name, shape, device, text, backend, out):
        k = sum(1 for n in order if n == name)
        order.append(name)
        row = {"step_time_s": times[name][k], "aten_ops": 7, "host_syncs": 0, "peak_mem_bytes": None}
        return {**row, "spel_time_s": 0.01 * (k + 1), "dim": 64, "rank": 16} if name in BOUNDARY_ROWS else row

    monkeypatch.setattr(throughput, "measure", measure)
    data = bench_throughput(tmp_path, "tiny", "cpu", quick=False, rows=("plain compiled", "boundary", "train eager"))
    assert order == ["plain compiled", "MAPL boundary step", "train eager",
                     "MAPL boundary step", "train eager", "plain compiled",
                     "train eager", "plain compiled", "MAPL boundary step"]
    lines = {ln["row"]: ln for ln in data["lines"]}
    train = lines["train eager"]
    assert train["step_time_s"] == 1.5 and train["step_time_rounds"] == [1.5, 2.0, 1.2]
    assert (train["ratio_median"], train["ratio_min"], train["ratio_max"]) == (1.2, 1.0, 1.5)  # 1.5, 1.0, 1.2
    assert train["ratio_to_plain_compiled"] == 1.2 and lines["plain compiled"]["ratio_max"] == 1.0
    assert lines["MAPL boundary step"]["spel_time_s"] == 0.02
    report = (tmp_path / "report.md").read_text()
    assert "| train eager | 1.5000 |" in report and "| 1.20 [1.00–1.50] |" in report
    assert "in each of 3 rounds" in report


def test_a_row_failing_in_any_round_is_that_error(tmp_path, monkeypatch):
    calls = []

    def measure(name, shape, device, text, backend, out):
        calls.append(name)
        if name == "plain eager" and calls.count(name) == 2:
            return {"error": "RuntimeError: out of memory"}
        return {"step_time_s": 1.0, "aten_ops": 7, "host_syncs": 0, "peak_mem_bytes": None}

    monkeypatch.setattr(throughput, "measure", measure)
    lines = {ln["row"]: ln for ln in bench_throughput(tmp_path, "tiny", "cpu", rows=PLAIN)["lines"]}
    failed = lines["plain eager"]
    assert failed["error"] == "RuntimeError: out of memory" and failed["step_time_s"] is None
    assert lines["plain compiled"]["ratio_to_plain_compiled"] == 1.0
