"""One protocol per parallel mode (slimpar/train/modes): outside the strategies and the modes themselves, at most
five places branch on ``parallel.mode``; the rest ask the run's mode. Counted on the source's syntax tree: every
comparison with a ``.mode`` attribute or a name ``mode`` on one side."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from slimpar.config import load_config
from slimpar.train.modes import MODES, mode_of
from tests.helpers import TINY

ROOT = Path(__file__).resolve().parents[2] / "slimpar"
OWNERS = (ROOT / "train" / "strategies", ROOT / "train" / "modes")
MAX_BRANCHES = 5


def _is_mode(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "mode") or (isinstance(node, ast.Name)
                                                                          and node.id == "mode")


def mode_branches() -> list[str]:
    """``file:line`` of every comparison on the parallel mode outside the strategies and modes."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        if any(owner in path.parents for owner in OWNERS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(_is_mode(n) for n in (node.left, *node.comparators)):
                out.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    return out


def test_at_most_five_mode_branches_outside_the_strategies():
    found = mode_branches()
    assert len(found) <= MAX_BRANCHES, found


def test_the_counter_sees_a_branch(tmp_path):
    """The count is not vacuous: it finds the comparisons it is meant to find."""
    probe = ROOT / "_probe_branches.py"
    probe.write_text("def f(cfg, mode):\n    return cfg.parallel.mode == 'sdp' or mode in ('ddp',)\n")
    try:
        assert [b for b in mode_branches() if "_probe_branches" in b] == ["slimpar/_probe_branches.py:2"] * 2
    finally:
        probe.unlink()


@pytest.mark.parametrize("name", sorted(MODES))
def test_every_mode_answers_for_its_name(name):
    cfg = load_config(TINY, ["--parallel.mode", name])
    mode = mode_of(cfg)
    assert mode.name == name and mode.kind(cfg).startswith(name)
    assert mode.data_parallel(cfg) >= 1 and mode.worker_step(cfg) >= 1
