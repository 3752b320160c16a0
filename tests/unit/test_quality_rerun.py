"""benchmarks/quality/rerun.py: a recorded run becomes the same training command with the recorded final evaluation,
and the comparison's paired changes, gaps and spread verdict match a hand computation."""

import pytest

from benchmarks.quality.rerun import compare, recorded, row_of


def _run(row: str, seed: int, loss: float) -> dict:
    cmd = (f"slimpar train --config configs/llama_quality.toml --train.seed {seed} --train.steps 2000 "
           f"--pipeline.codec {'none' if row == 'none' else 'mapl'}")
    return {"group": "mapl", "row": row, "seed": seed, "command": cmd, "summary": {"val_loss": loss}}


def test_a_recorded_run_becomes_its_command_with_the_recorded_final_evaluation():
    row = row_of(_run("MAPL 4x", 2, 3.7))
    assert (row.name, row.group, row.seed, row.config) == ("MAPL 4x", "mapl", 2, "configs/llama_quality.toml")
    assert row.overrides == ["--train.steps", "2000", "--pipeline.codec", "mapl", "--eval.final_tokens", "0"]
    assert row.env == {"OMP_NUM_THREADS": "1"}
    given = _run("MAPL 4x", 0, 3.7)
    given["command"] += " --eval.final_tokens 0"
    assert row_of(given).overrides.count("--eval.final_tokens") == 1


def test_the_comparison_is_paired_by_seed():
    old = [_run("none", 0, 3.0), _run("none", 1, 4.0), _run("MAPL 4x", 0, 3.3), _run("MAPL 4x", 1, 4.2)]
    new = [_run("none", 0, 3.03), _run("none", 1, 4.0), _run("MAPL 4x", 0, 3.3), _run("MAPL 4x", 1, 4.41)]
    none, mapl = compare(old, new)
    assert none["change"][0] == pytest.approx((0.01 + 0.0) / 2)
    assert mapl["change"][0] == pytest.approx((0.0 + 0.05) / 2)
    assert mapl["gap_recorded"][0] == pytest.approx((0.1 + 0.05) / 2)
    assert mapl["gap_rerun"][0] == pytest.approx((3.3 / 3.03 - 1 + 4.41 / 4.0 - 1) / 2)
    spread = (0.9 * 2 ** 0.5 / 2) / 3.75  # sample std of (3.3, 4.2) over their mean
    assert mapl["recorded_rel_std"] == pytest.approx(spread)
    assert mapl["within_spread"] == (0.025 <= spread)


def test_a_row_the_record_lacks_is_named():
    with pytest.raises(ValueError, match="mapl/no such row"):
        recorded(["mapl/none", "mapl/no such row"])
