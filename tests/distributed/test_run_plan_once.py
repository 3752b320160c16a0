"""A run is resolved once per process (slimpar/train/run_plan.py): the SDP plan of one ``slimpar train`` is built
once in the launching process (its start-up checks, memory floor and launcher all read that one) and once in each
worker, and ``slimpar plan`` builds it once. Every build appends its process id to ``$SLIMPAR_PLAN_LOG``."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

from tests.helpers import ROOT, TINY, run_train

SDP = ["--parallel.mode", "sdp", "--sdp.keep", "0.5", "--train.steps", "2", "--eval.every", "-1"]


def _builds(log) -> Counter:
    return Counter(log.read_text().split()) if log.exists() else Counter()


def test_one_plan_build_per_process_in_a_two_worker_run(tmp_path, monkeypatch):
    log = tmp_path / "plans.log"
    monkeypatch.setenv("SLIMPAR_PLAN_LOG", str(log))
    run_train(tmp_path / "run", *SDP, "--parallel.workers", "2")
    builds = _builds(log)
    assert len(builds) == 3, builds  # the launcher and two workers, each its own process
    assert set(builds.values()) == {1}, builds


def test_one_plan_build_in_a_virtual_run(tmp_path, monkeypatch):
    """Virtual SDP runs every worker in the launching process: checks, launcher and strategy share one plan."""
    log = tmp_path / "plans.log"
    monkeypatch.setenv("SLIMPAR_PLAN_LOG", str(log))
    run_train(tmp_path / "run", *SDP, "--sdp.virtual", "true", "--sdp.virtual_workers", "2")
    assert list(_builds(log).values()) == [1]


def test_slimpar_plan_builds_once(tmp_path, monkeypatch):
    log = tmp_path / "plans.log"
    cmd = [sys.executable, "-m", "slimpar", "plan", "--config", str(TINY), "--parallel.workers", "4", "--json"]
    env = {**__import__("os").environ, "SLIMPAR_PLAN_LOG": str(log)}
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert list(_builds(log).values()) == [1]
