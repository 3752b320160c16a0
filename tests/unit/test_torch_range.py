"""The supported torch range: declared once (pyproject.toml, slimpar/torch_range.py and CI's floor leg agree), an
installed torch outside it is one line and exit 2 before anything runs, ``slimpar --version`` names both, and the
APIs newer than the floor are feature-detected (slimpar/parallel/compat.py) on whichever torch is installed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from slimpar import cli, torch_range
from slimpar.config import load_config, tomllib
from slimpar.parallel import compat
from slimpar.torch_range import FLOOR, SUPPORTED, UnsupportedTorch, check_torch
from slimpar.train.launch import launcher
from tests.helpers import ROOT, TINY


def test_pyproject_ci_and_the_module_declare_one_range():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [d for d in deps if d.startswith("torch")] == [f"torch{SUPPORTED}"]
    floor = re.search(r"^FLOOR_TORCH=(\S+)", (ROOT / ".ci" / "floor").read_text(), flags=re.M).group(1)
    assert torch_range.release(floor) == FLOOR
    assert "bash .ci/floor" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("version, ok", [("2.11.0+cu130", True), ("2.13.0+cpu", True), ("2.15.0", True),
                                         ("2.10.2", False), ("2.16.0.dev20261101", False), ("1.13.1", False)])
def test_the_range_admits_exactly_its_versions(version, ok):
    if ok:
        assert check_torch(version) == version
    else:
        with pytest.raises(UnsupportedTorch, match=re.escape(f"torch {version} is installed")) as e:
            check_torch(version)
        assert SUPPORTED in str(e.value) and "\n" not in str(e.value)


def test_the_installed_torch_is_in_the_range():
    assert check_torch() == torch_range.installed_torch()
    assert torch.__version__.startswith(torch_range.installed_torch().split("+")[0])


def test_an_unsupported_torch_is_one_line_and_exit_2_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch_range, "installed_torch", lambda: "2.9.1+cu128")
    out = tmp_path / "run"
    assert cli.main(["train", "--config", str(TINY), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "torch 2.9.1+cu128 is installed" in err and SUPPORTED in err
    assert not out.exists()  # nothing written


def test_version_names_torch_and_the_range():
    proc = subprocess.run([sys.executable, "-m", "slimpar", "--version"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 0
    assert f"torch {torch_range.installed_torch()}" in proc.stdout and SUPPORTED in proc.stdout


def test_ddp_buffer_sync_uses_the_keyword_this_torch_has(monkeypatch):
    has_new = compat._ddp_has_forward_sync_buffers()
    assert compat.ddp_buffer_sync(True) == {("forward_sync_buffers" if has_new else "broadcast_buffers"): True}
    monkeypatch.setattr(compat, "_ddp_has_forward_sync_buffers", lambda: False)  # torch 2.11 and 2.12
    assert compat.ddp_buffer_sync(False) == {"broadcast_buffers": False}


def test_a_torch_without_shutdown_timeout_gets_a_launch_config_and_a_grace_inside_its_wait(monkeypatch):
    fields = compat._launch_config_fields()
    monkeypatch.setattr(compat, "_launch_config_fields", lambda: fields - {"shutdown_timeout"})  # torch 2.11
    lc = compat.launch_config(45, min_nodes=1, max_nodes=1, nproc_per_node=2)
    assert lc.nproc_per_node == 2 and compat.agent_shutdown_s(45) == compat.AGENT_SHUTDOWN_FIXED_S
    cfg = launcher._grace_within_agent_wait(load_config(TINY))  # on_signal_s 30 + a 15 s margin > the fixed 30 s
    assert cfg.checkpoint.on_signal_s == compat.AGENT_SHUTDOWN_FIXED_S - launcher.SHUTDOWN_MARGIN_S
    monkeypatch.setattr(compat, "_launch_config_fields", lambda: fields | {"shutdown_timeout"})  # torch >= 2.12
    assert launcher._grace_within_agent_wait(load_config(TINY)).checkpoint.on_signal_s == 30.0


def test_a_torch_without_distribution_metadata_is_read_from_its_version_file(monkeypatch):
    """A torch built from source or copied into an image may have no metadata; its version.py still tells."""
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(torch_range.metadata, "version", missing)
    assert torch_range.installed_torch() == torch.__version__
