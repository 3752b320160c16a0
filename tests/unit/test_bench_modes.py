"""``slimpar bench modes``: one group of eager / compiled / bf16 rows per mode, and tables that divide each mode's
compiled step time and bf16 memory by its own eager fp32 run's (checked on hand-made results)."""

from benchmarks.modes import BF16_STEPS, MODES, VARIANTS, lines, report_markdown, rows, timed
from benchmarks.timing import step_time_ratios


def _run(mode: str, variant: str, step: float, peak: int, act: int, loss: float, rnd: int = 0,
         curve: tuple = ()) -> dict:
    return {"group": mode, "row": variant, "seed": 0, "timing_round": rnd, "load_1m": 1.0,
            "curve": [{"step": s, "loss": v} for s, v in curve],
            "summary": {"step_time_s": step, "peak_mem_bytes": peak, "val_loss": loss,
                        "mem_breakdown": {"activations": act}}}


def test_every_mode_has_its_three_variants_on_the_same_tokens():
    all_rows = rows(False, 30)
    assert len(all_rows) == 3 * len(MODES)
    for mode in MODES:
        group = [r for r in all_rows if r.group == mode]
        assert [r.name for r in group] == list(VARIANTS)
        common = group[0].overrides[:-2]
        assert group[0].overrides == common + ["--train.steps", "30"]
        assert group[1].overrides == common + ["--train.steps", "30", "--train.compile", "true"]
        assert group[2].overrides == common + ["--train.steps", str(BF16_STEPS), "--train.dtype", "bf16"]
        assert "--log.every" in common  # every step's loss, so that bf16's is compared at its last step
    assert [r.name for r in timed(all_rows)] == ["eager", "compiled"] * len(MODES)


def test_ratios_are_per_mode_against_its_own_eager_run():
    k = BF16_STEPS
    results = [_run("DDP", "eager", 2.0, 400, 100, 3.0, curve=((k - 1, 5.0), (k, 4.5), (k + 1, 4.0))),
               _run("DDP", "compiled", 1.0, 400, 100, 3.0), _run("DDP", "bf16", 6.0, 300, 50, 4.2, curve=((k, 4.52),))]
    timings = [_run("DDP", "eager", 4.0, 0, 0, 0, 1), _run("DDP", "compiled", 3.0, 0, 0, 0, 1)]
    table = lines(results, step_time_ratios(results, timings, "eager"))
    (ln,) = table
    assert ln["compiled_vs_eager"]["ratio"] == [0.5, 0.75] and ln["compiled_vs_eager"]["ratio_median"] == 0.625
    assert ln["bf16_vs_eager"]["ratio"] == [3.0]  # its own run against eager's, no timing round
    assert ln["bf16_activation_bytes"] == 50 and ln["fp32_activation_bytes"] == 100
    assert (ln["fp32_loss_at_bf16_steps"], ln["bf16_loss_at_bf16_steps"]) == (4.5, 4.52)
    meta = {"date": "d", "machine": "m", "cpus": 2, "git_commit": "abc", "versions": {"torch": "t"}, "steps": 30,
            "timing": None, "timing_rounds": 1}
    text = report_markdown(table, meta)
    assert "| DDP | 2.000 | 1.000 | 0.62 [0.50–0.75]" in text
    assert "| 4.5000 | 4.5200 | +0.0200 | 3.00" in text


def test_every_row_is_a_valid_run_config():
    """Each row's overrides pass the CLI's own validation (a virtual row needs one process; caught by a full run)."""
    from benchmarks.modes import CONFIG
    from benchmarks.runner import CONFIGS
    from slimpar.train.validate.checks import load_run_config

    for row in rows(False, 10):
        load_run_config(CONFIGS / CONFIG.split("/")[-1], row.overrides)
