"""A tied pipeline's summary says what it sends: the tied embedding/head exchange apart from the boundaries.

On a 2-stage virtual MAPL 4x pipeline of tied llama_tiny (the same stages, codecs and tied exchange as the
distributed pipeline, in one process): boundary bytes + tied bytes = the totals the run reports, the tied
bytes equal the hand count from ``tied_sync`` (stage 0 sends its embedding gradient on the step's u distinct
ids, stage P − 1 its dense V × d head gradient, fp32), the boundary-only ratio is the codec's, and the closing
table shows both ratios. ``pipeline.tied_sync_dtype int8`` (not the default) sends about a quarter of the bytes.
"""

from __future__ import annotations

import pytest
import torch

from slimpar.pipeline import accounting
from slimpar.train.build import build_data
from slimpar.train.validate.checks import load_run_config
from tests.helpers import TINY, VIRTUAL_PIPELINE, batch_fn, train_virtual_pipeline

B, T, D, STEPS = 8, 64, 64, 3
R = D // 4  # MAPL 4x


def _run(tie: str, *overrides: str) -> tuple[dict, object]:
    cfg = load_run_config(TINY, [*VIRTUAL_PIPELINE, "--model.tie_embeddings", tie, "--pipeline.stages", "2",
                                 "--pipeline.microbatches", "2", "--pipeline.codec", "mapl",
                                 "--pipeline.compression", "4", "--pipeline.compression_of", "payload",
                                 "--pipeline.projector_init", "random", *overrides])
    data = build_data(cfg)
    strat = train_virtual_pipeline(cfg, data, STEPS)
    strat.evaluate(data, cfg)  # evaluation traffic is not training traffic
    ids = [batch_fn(data, cfg)(step, 0)[0] for step in range(STEPS)]
    if tie == "true":  # whatever the tied exchange's wire form, both copies sum the same parts
        assert torch.equal(strat.stages[0].model.tok_embeddings.weight, strat.stages[-1].model.output.weight)
    return strat.summary_extras(), (cfg, ids)


def test_tied_bytes_are_reported_apart_from_the_boundary() -> None:
    s, (cfg, ids) = _run("true")
    V = cfg.data.vocab_size
    # hand count, per step: u distinct ids × d fp32 from stage 0, the dense V × d fp32 head from stage 1
    tied_fwd = sum(len(torch.unique(x)) * D * 4 for x in ids) / STEPS
    assert s["tied_bytes_per_step_fwd"] == pytest.approx(tied_fwd)
    assert s["tied_bytes_per_step_bwd"] == V * D * 4
    for d in ("fwd", "bwd"):
        assert s[f"boundary_bytes_per_step_{d}"] + s[f"tied_bytes_per_step_{d}"] == s[f"comm_bytes_per_step_{d}"]
        assert s["comm_breakdown"]["b1"][d]["tied"] == s[f"tied_bytes_per_step_{d}"]  # the tied link, P − 1
    # the boundary alone is the codec: r fp32 codes per token each way plus A's int8 gradient part and scales
    boundary = B * T * R * 4 + D * R + D * 4
    assert s["boundary_bytes_per_step_fwd"] == s["boundary_bytes_per_step_bwd"] == boundary
    none = B * T * D * 4
    assert s["compression_ratio_boundary"] == pytest.approx(none / boundary)
    assert s["compression_ratio_boundary"] > 3.5 > s["compression_ratio"]  # the tied exchange is what drags it
    total = sum(s[f"comm_bytes_per_step_{d}"] for d in ("fwd", "bwd"))
    assert s["compression_ratio"] == pytest.approx(2 * none / total)
    rows = dict(accounting.summary_rows(s))
    assert rows["compression ratio, boundaries (fwd + bwd)"] == f"{none / boundary:.2f}x"
    assert "tied weight exchange / step, last → stage 0" in rows


def test_untied_pipeline_has_no_tied_bytes_and_one_ratio() -> None:
    s, _ = _run("false")
    assert s["tied_bytes_per_step_fwd"] == s["tied_bytes_per_step_bwd"] == 0
    assert s["compression_ratio_boundary"] == s["compression_ratio"]
    rows = dict(accounting.summary_rows(s))
    assert "compression ratio (fwd + bwd)" in rows and not any("tied" in k for k in rows)


def test_int8_tied_exchange_sends_a_byte_and_a_row_scale_per_number() -> None:
    """``pipeline.tied_sync_dtype int8``: (u + V) rows of d int8 values and one fp32 scale, copies identical."""
    s, (cfg, ids) = _run("true", "--pipeline.tied_sync_dtype", "int8")
    V = cfg.data.vocab_size
    assert s["tied_bytes_per_step_fwd"] == pytest.approx(sum(len(torch.unique(x)) for x in ids) / STEPS * (D + 4))
    assert s["tied_bytes_per_step_bwd"] == V * (D + 4)
