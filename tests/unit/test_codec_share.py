"""A run says what its compression became: r, every byte a boundary sends as a fraction of ``none``'s, and the
payload's share of it, at start-up (the byte model: pipeline/budget.py) and in summary.json and the closing table
(the counted bytes), both against a hand count.

The hand count: d = 64, 8 × 64 = 512 tokens a step in 2 microbatches, so ``none`` sends 512 · 64 · 4 = 131,072
bytes per boundary each way. MAPL 4x with local ids and receiver anchors (the defaults) sends, at rank r, the
payload 512 · r · 4 each way and A's int8 gradient part (64 · r bytes and 64 fp32 scales) each way: 2,112 r + 256
bytes, <= 131,072 / 4 = 32,768 at r = 15 (r = 16, the payload meaning's d / 4, would send 34,048).
"""

from __future__ import annotations

import pytest

from slimpar.pipeline import CodecSpec, StepShape, accounting
from slimpar.pipeline.budget import budget_share
from slimpar.train.build import build_data
from slimpar.train.validate.checks import load_run_config
from tests.helpers import TINY, VIRTUAL_PIPELINE, train_virtual_pipeline

NONE, R = 131_072, 15
SENT, PAYLOAD = 2_112 * R + 256, 512 * R * 4  # 31,936 and 30,720 bytes each way
LINE = ("pipeline codec mapl, compression 4 of every byte (total): r = 15 of d = 64; a boundary sends 0.244 (fwd) / "
        "0.244 (bwd) of none's bytes per step, the payload 96.2% / 96.2% of them")


def test_the_share_of_a_spec_is_the_hand_count():
    step = StepShape(4, 64, 2, checksum_every=0)
    share = budget_share(CodecSpec.mapl(64, 4, vocab=512, step=step), step)
    assert share.rank == R
    assert share.fraction == {"fwd": SENT / NONE, "bwd": SENT / NONE}
    assert share.payload_share == {"fwd": PAYLOAD / SENT, "bwd": PAYLOAD / SENT}


def test_a_run_reports_its_rank_fraction_and_payload_share():
    cfg = load_run_config(TINY, [*VIRTUAL_PIPELINE, "--pipeline.stages", "2", "--pipeline.microbatches", "2",
                                 "--pipeline.codec", "mapl", "--pipeline.checksum_every", "0",
                                 "--pipeline.projector_init", "random"])  # no PCA start's one-off bytes
    data = build_data(cfg)
    strat = train_virtual_pipeline(cfg, data, 2)
    assert strat.startup_note() == LINE
    strat.evaluate(data, cfg)  # the end of a run: the counted bytes are summed (evaluation's are not training's)
    s = strat.summary_extras()
    assert s["pipeline_rank"] == R
    for d in ("fwd", "bwd"):
        assert s[f"boundary_bytes_per_step_{d}"] == SENT
        assert s[f"boundary_fraction_{d}"] == pytest.approx(SENT / NONE)
        assert s[f"payload_share_{d}"] == pytest.approx(PAYLOAD / SENT)
    rows = dict(accounting.summary_rows(s))
    assert rows["rank r; payload share of boundary bytes (fwd / bwd)"] == "15; 96.2% / 96.2%"
