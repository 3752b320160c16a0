"""``slimpar bench`` loads the benchmarks from the checkout's benchmarks/ folder, which the installed package does
not hold; without that folder it ends with one line saying where they live (exit 2)."""

import subprocess
import sys

import pytest

from slimpar import cli_bench
from slimpar.cli import main
from slimpar.config import ConfigError
from tests.helpers import ROOT


def test_the_checkout_folder_is_found_beside_the_package():
    assert cli_bench.benchmarks_folder() == ROOT / "benchmarks"


def test_the_benchmarks_load_by_path_when_they_are_not_on_sys_path(monkeypatch):
    here = {str(ROOT), "", "."}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in here])
    for name in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
        monkeypatch.delitem(sys.modules, name)
    module = cli_bench.load_benchmarks_cli()
    assert module.__file__ == str(ROOT / "benchmarks" / "cli.py")
    assert sys.path[0] == str(ROOT) and callable(module.bench_command)


def test_a_missing_folder_is_one_line_naming_the_repository_folder(tmp_path, monkeypatch, capsys):
    with pytest.raises(ConfigError, match=r"repository's benchmarks/ folder"):
        cli_bench.load_benchmarks_cli(tmp_path / "benchmarks")
    monkeypatch.setattr(cli_bench, "benchmarks_folder", lambda: tmp_path / "benchmarks")
    assert main(["bench", "plans", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"slimpar: error: {cli_bench.MISSING}"]
    assert "python -m slimpar bench" in err[0] and not (tmp_path / "out").exists()


def test_another_package_of_that_name_is_refused(tmp_path):
    import benchmarks.cli  # noqa: F401  the checkout's, imported first

    other = tmp_path / "benchmarks"
    other.mkdir()
    (other / "__init__.py").write_text("")
    (other / "cli.py").write_text("def bench_command(args, rest):\n    return 0\n")
    with pytest.raises(ConfigError, match="is not the checkout's"):
        cli_bench.load_benchmarks_cli(other)


def test_the_command_runs_from_a_checkout_outside_its_root(tmp_path):
    """``python -m slimpar bench`` from another folder, slimpar found through PYTHONPATH (a checkout)."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "slimpar", "bench", "readme", "--check"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "match docs/results" in proc.stdout
