"""benchmarks/quality/rerun.py: a recorded run becomes the same training command with the recorded final evaluation,
and the comparison's paired changes, gaps and spread verdict match a hand computation."""

import pytest

from benchmarks.quality.rerun import RECORDED_DEFAULTS, compare, recorded, row_of


def _run(row: str, seed: int, loss: float, fwd: float = 100.0) -> dict:
    cmd = (f"slimpar train --config configs/llama_quality.toml --train.seed {seed} --train.steps 2000 "
           f"--pipeline.codec {'none' if row == 'none' else 'mapl'}")
    return {"group": "mapl", "row": row, "seed": seed, "command": cmd,
            "summary": {"val_loss": loss, "comm_bytes_per_step_fwd": fwd, "comm_bytes_per_step_bwd": 100.0}}


PINS = ["--pipeline.compression_of", "payload", "--pipeline.anchors", "none", "--pipeline.anchor_form", "symmetric",
        "--pipeline.ids", "send", "--pipeline.spel_lr", "0.01", "--pipeline.spel_schedule", "model",
        "--pipeline.clip_projector", "global"]


def test_a_recorded_run_becomes_its_command_with_the_recorded_final_evaluation():
    row = row_of(_run("MAPL 4x", 2, 3.7))
    assert (row.name, row.group, row.seed, row.config) == ("MAPL 4x", "mapl", 2, "configs/llama_quality.toml")
    assert row.overrides == ["--train.steps", "2000", "--pipeline.codec", "mapl", *PINS, "--eval.final_tokens", "0"]
    assert row.env == {"OMP_NUM_THREADS": "1"}
    given = _run("MAPL 4x", 0, 3.7)
    given["command"] += " --eval.final_tokens 0"
    assert row_of(given).overrides.count("--eval.final_tokens") == 1


def test_options_whose_defaults_changed_keep_their_recorded_values():
    """A pipeline command that names an option keeps it; the others get the values the record trained with (by hand,
    from the record's run folders: r = d / K, no anchors, ids sent, SPEL at 0.01 on the model's schedule)."""
    run = _run("MAPL 4x + all changes", 0, 3.6)
    run["command"] += " --pipeline.anchors factorized --pipeline.spel_lr 0.001"
    words = row_of(run).overrides
    assert words[words.index("--pipeline.anchors") + 1] == "factorized" and words.count("--pipeline.anchors") == 1
    assert words[words.index("--pipeline.spel_lr") + 1] == "0.001" and words.count("--pipeline.spel_lr") == 1
    assert words[words.index("--pipeline.compression_of") + 1] == "payload"
    assert len(RECORDED_DEFAULTS) == 7
    sdp = _run("DDP", 0, 3.0)
    sdp["command"] = sdp["command"].replace(" --pipeline.codec mapl", " --parallel.mode ddp")
    assert not any(w.startswith("--pipeline.") for w in row_of(sdp).overrides)


def test_bytes_that_moved_are_flagged():
    old = [_run("MAPL 4x", 0, 3.3), _run("MAPL 4x", 1, 3.4), _run("none", 0, 3.0), _run("none", 1, 3.1)]
    new = [_run("MAPL 4x", 0, 3.3, fwd=90.0), _run("MAPL 4x", 1, 3.4), _run("none", 0, 3.0), _run("none", 1, 3.1)]
    mapl, none = compare(old, new)
    assert (mapl["same_bytes"], none["same_bytes"]) == (False, True)


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
