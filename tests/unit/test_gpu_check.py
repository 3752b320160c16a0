"""The device check (``slimpar bench gpu``): its rows fit its 4-minute budget by their own limits, every row's
command is a valid run, a failing or overlong row is recorded and the next one runs, and results.json is written
after every row."""

import json
import sys

import pytest

from slimpar.bench import gpu_check
from slimpar.bench.gpu_check import BUDGET_S, ROWS, GpuRow, bench_gpu, check_budget


def test_the_rows_fit_the_budget_and_cover_what_the_cpu_cannot():
    assert check_budget(ROWS) <= BUDGET_S == 240
    names = " ".join(r.name for r in ROWS)
    for needed in ("NCCL", "DCP", "virtual B-SDP", "batched", "cuda:gloo", "MAPL + RVQ", "SSN", "compile", "134M",
                   "TF32"):
        assert needed in names, needed
    with pytest.raises(ValueError, match="budget"):
        check_budget(ROWS + [GpuRow("long", "", ["true"], BUDGET_S)])


def test_every_training_row_is_a_valid_run(tmp_path):
    from slimpar.train.validate.checks import load_run_config

    for row in ROWS:
        for argv in [row.argv] + ([row.then] if row.then else []):
            if "train" not in argv:
                continue
            fill = {"{out}": str(tmp_path), "{corpus}": __file__, "{device}": "cpu"}
            args = [fill.get(a, a) for a in argv[argv.index("train") + 1:]]
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
            assert [r["row"] for r in json.loads((out / "results.json").read_text())["rows"]] == seen
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
