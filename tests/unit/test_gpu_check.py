"""The device check (``slimpar bench gpu``): its rows fit its 8-minute budget by their own limits, every row's
command is a valid run, a failing or overlong row is recorded with the numbers it had and the next one runs, and
results.json (with the torch, CUDA and NCCL versions) is written after every row."""

import json
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check
from benchmarks.gpu_check import BUDGET_S, ROWS, GpuRow, bench_gpu, check_budget, select
from benchmarks.throughput import parse_rows, row_names


def test_the_rows_fit_the_budget_and_cover_what_the_cpu_cannot():
    assert check_budget(ROWS) <= BUDGET_S == 480
    names = " ".join(r.name for r in select(None))
    for needed in ("NCCL", "DCP", "launcher DDP", "virtual B-SDP", "batched", "cuda:gloo", "MAPL + RVQ", "SSN",
                   "none", "compile", "134M", "TF32"):
        assert needed in names, needed
    assert "throughput" not in names  # the speed rows are a device call of their own
    with pytest.raises(ValueError, match="check rows may take"):
        check_budget(ROWS + [GpuRow("long", "", ["true"], BUDGET_S)])
    with pytest.raises(ValueError, match="speed rows may take"):
        check_budget(ROWS + [GpuRow("long", "", ["true"], BUDGET_S, part="speed")])


def test_the_speed_part_runs_the_throughput_bench_on_valid_rows():
    """``--rows speed``: slimpar bench throughput at 134M and 1B, each row naming rows the bench has on a GPU."""
    speed = select({"speed"})
    assert [r.name for r in speed] == ["throughput 134M, compile", "throughput 134M, virtual pipeline",
                                       "throughput 1B"]
    covered = set()
    for row in speed:
        argv = row.argv
        assert row.cuda_only and argv[argv.index("--device") + 1] == "{device}"
        covered |= set(row_names("cuda", parse_rows(argv[argv.index("--rows") + 1])))
    assert covered == set(row_names("cuda"))  # every throughput row is measured at 134M or 1B
    assert [r.name for r in select({"throughput 1B"})] == ["throughput 1B"]
    with pytest.raises(ValueError, match="no row or part fast"):
        select({"fast"})


def test_every_training_row_is_a_valid_run(tmp_path):
    from slimpar.train.validate.checks import load_run_config

    for row in ROWS:
        for argv in [row.argv] + ([row.then] if row.then else []):
            if "train" not in argv:
                continue
            args = gpu_check._argv(argv[argv.index("train") + 1:], tmp_path, Path(__file__), "cpu")
            config = args[args.index("--config") + 1]
            rest = args[:args.index("--config")] + args[args.index("--config") + 2:]
            rest = [a for i, a in enumerate(rest) if a != "--out" and (i == 0 or rest[i - 1] != "--out")]
            load_run_config(config, rest)  # raises ConfigError on a row that could not start


def test_a_failing_and_an_overlong_row_are_recorded_and_the_check_goes_on(tmp_path, monkeypatch):
    rows = [GpuRow("fails", "exits 3", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], 20),
            GpuRow("hangs", "sleeps past its limit", [sys.executable, "-c", "import time; time.sleep(30)"], 2),
            GpuRow("works", "prints", [sys.executable, "-c", "print('fine')"], 20),
            GpuRow("needs a GPU", "", ["true"], 1, cuda_only=True)]
    monkeypatch.setattr(gpu_check, "ROWS", rows)
    seen = []
    real = gpu_check.run_row

    def spy(row, out, text, device):
        if seen:  # results.json already holds every row before this one
            assert [r["row"] for r in json.loads((out.parent / "results.json").read_text())["rows"]] == seen
        seen.append(row.name)
        return real(row, out, text, device)

    monkeypatch.setattr(gpu_check, "run_row", spy)
    data = bench_gpu(tmp_path, device="cpu")
    status = {r["row"]: r["status"] for r in data["rows"]}
    assert status == {"fails": "failed", "hangs": "timeout", "works": "ok", "needs a GPU": "not run"}
    fails = data["rows"][0]
    assert fails["rc"] == 3 and "boom" in fails["tail"]
    assert data["rows"][1]["seconds"] < 10  # killed at its limit, not waited for
    assert "| hangs | timeout |" in (tmp_path / "report.md").read_text()


def test_a_row_cut_short_keeps_what_it_printed_and_wrote(tmp_path, monkeypatch):
    """The SPEL row printed its numbers before its limit on a fresh machine: a timeout keeps them, and a training
    row cut short keeps its last metrics record. The whole process group goes at the limit."""
    script = ("import json, pathlib, sys, time, subprocess; f = pathlib.Path(sys.argv[1]); f.mkdir(parents=True); "
              "(f / 'metrics.jsonl').write_text(json.dumps({'step': 4, 'train_loss': 5.5}) + '\\n'); "
              "print(json.dumps({'orth': 1.2e-6}), flush=True); "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")
    rows = [GpuRow("slow", "prints, then sleeps past its limit", [sys.executable, "-c", script, "{out}"], 3)]
    monkeypatch.setattr(gpu_check, "ROWS", rows)
    data = bench_gpu(tmp_path, device="cpu")
    row = data["rows"][0]
    assert row["status"] == "timeout" and row["seconds"] < 10
    assert row["printed"] == [{"orth": 1.2e-6}] and row["partial"] == {"step": 4, "train_loss": 5.5}
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["versions"]["torch"] and "nccl" in saved["versions"] and "cuda" in saved["versions"]
    assert "torch " in (tmp_path / "report.md").read_text()
    assert (tmp_path / "runs" / ".gitignore").read_text() == "*\n"  # scratch run folders stay out of git


def test_the_tf32_row_runs_and_reports_spels_waits_and_orthogonality():
    """The row's own function runs on the CPU and reports every number, so a GPU session does not find it broken.
    On the CPU no step would wait whatever SPEL's timing did; the CUDA half is tests/unit/test_span_timer.py."""
    out = gpu_check.tf32_check("cpu")
    assert out["spel_step_synchronizes"] == 0 and out["spel_ms_median"] > 0
    assert out["spel_master_orth"] <= 1e-5 and out["polar_express_orth"] <= 1e-5
