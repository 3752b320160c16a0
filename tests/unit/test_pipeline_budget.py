"""``pipeline.compression_of = total``: the rank that keeps every byte a boundary sends under 1/K of ``none``.

The byte model (pipeline/budget.py) against the virtual pipeline's own ``ByteCounter``: equal to the byte
where nothing depends on the data, an upper bound where something does (symmetric anchors' touched rows,
RVQ codebook rows); the fitted rank is the largest under the budget; a budget no rank meets is one clear
error before anything runs.
"""

from __future__ import annotations

import dataclasses

import pytest

from slimpar.config import ConfigError
from slimpar.pipeline.budget import fit_rank, none_bytes, steady_bytes
from slimpar.train.build import build_data
from slimpar.train.strategies.pipeline_specs import codec_specs, step_shape
from slimpar.train.validate.checks import load_run_config
from tests.helpers import TINY, VIRTUAL_PIPELINE, train_virtual_pipeline

BASE = [*VIRTUAL_PIPELINE, "--pipeline.stages", "3", "--pipeline.microbatches", "2", "--pipeline.checksum_every", "0",
        "--pipeline.compression_of", "total"]
EXACT = {  # nothing these send depends on the data
    "mapl 4x": ["--pipeline.codec", "mapl"],
    "mapl 8x, bf16 sync": ["--pipeline.codec", "mapl", "--pipeline.compression", "8", "--pipeline.sync_dtype", "bf16"],
    "ssn 4x": ["--pipeline.codec", "ssn"],
    "naive 4x": ["--pipeline.codec", "naive"],
    "mapl 4x, receiver anchors": ["--pipeline.codec", "mapl", "--pipeline.anchors", "factorized",
                                  "--pipeline.anchor_form", "receiver", "--pipeline.anchor_dim", "8"],
    "mapl 4x, receiver anchors, local ids": ["--pipeline.codec", "mapl", "--pipeline.anchors", "factorized",
                                             "--pipeline.anchor_form", "receiver", "--pipeline.ids", "local"],
}
BOUNDED = {  # the model counts the worst case
    "mapl 4x, symmetric anchors": ["--pipeline.codec", "mapl", "--pipeline.anchors", "factorized",
                                   "--pipeline.anchor_dim", "8"],
    "mapl 16x + RVQ": ["--pipeline.codec", "mapl", "--pipeline.compression", "16", "--pipeline.rvq.levels", "2",
                       "--pipeline.rvq.codebook", "16", "--pipeline.rvq.update_every", "1"],
}


@pytest.fixture(scope="module")
def data():
    return build_data(load_run_config(TINY, BASE))


def _measured(data, cfg, steps: int = 3) -> list[dict[str, int]]:
    """Bytes per direction the virtual pipeline counted on its last step, per boundary."""
    strat = train_virtual_pipeline(cfg, data, steps)
    per = {}
    for (b, direction, _), n in strat.counter.step.items():
        per.setdefault(b, {"fwd": 0, "bwd": 0})[direction] += n
    assert sorted(per) == list(range(cfg.pipeline.stages - 1))
    return [per[b] for b in sorted(per)]


def _spec_and_budget(cfg, data):
    spec = codec_specs(cfg, 64, data.vocab_size)[0]
    shape = step_shape(cfg)
    return spec, shape, none_bytes(shape, 64) / cfg.pipeline.compression


@pytest.mark.parametrize("name", list(EXACT))
def test_model_equals_the_counter_and_the_rank_is_the_largest_that_fits(data, name: str) -> None:
    cfg = load_run_config(TINY, [*BASE, *EXACT[name]])
    spec, shape, budget = _spec_and_budget(cfg, data)
    model = steady_bytes(spec, shape)
    for got in _measured(data, cfg):
        assert got == model  # byte for byte, every boundary
    assert max(model.values()) <= budget
    bigger = steady_bytes(dataclasses.replace(spec, rank=spec.rank + 1), shape)
    assert max(bigger.values()) > budget  # one more number per token would break the budget
    payload_rank = 64 // cfg.pipeline.compression
    assert spec.rank <= payload_rank


@pytest.mark.parametrize("name", list(BOUNDED))
def test_model_bounds_the_counter_where_bytes_depend_on_the_data(data, name: str) -> None:
    cfg = load_run_config(TINY, [*BASE, *BOUNDED[name]])
    spec, shape, budget = _spec_and_budget(cfg, data)
    bound = steady_bytes(spec, shape)
    assert max(bound.values()) <= budget
    for got in _measured(data, cfg):
        assert got["fwd"] <= bound["fwd"] and got["bwd"] <= bound["bwd"]


def test_the_payload_meaning_is_unchanged_and_total_the_default_asks_for_less() -> None:
    payload = load_run_config(TINY, [*VIRTUAL_PIPELINE, "--pipeline.codec", "mapl", "--pipeline.compression_of",
                                     "payload"])
    total = load_run_config(TINY, [*VIRTUAL_PIPELINE, "--pipeline.codec", "mapl"])  # the default meaning
    assert total.pipeline.compression_of == "total"
    assert codec_specs(payload, 64, 512)[0].rank == 16
    # d = 64, 8 x 64 tokens in 4 microbatches: A's int8 parts (64 r + 256 bytes) come off the payload's share
    spec = codec_specs(total, 64, 512)[0]
    n = 8 * 64
    assert spec.rank == max(r for r in range(1, 65) if n * r * 4 + 64 * r + 64 * 4 <= n * 64 * 4 / 4)
    assert fit_rank(spec, step_shape(total), 4) == spec.rank


def test_no_rank_fits_is_one_clear_error() -> None:
    rvq = ["--pipeline.codec", "mapl", "--pipeline.compression", "64", "--pipeline.rvq.levels", "4"]
    with pytest.raises(ConfigError, match="even rank 1 sends more than 1/64"):  # what the CLI checks before a run
        load_run_config(TINY, [*VIRTUAL_PIPELINE, *rvq])  # the default meaning: total
    load_run_config(TINY, [*VIRTUAL_PIPELINE, *rvq, "--pipeline.compression_of", "payload"])  # rank 1
    with pytest.raises(ConfigError, match="compression_of = 'bytes' is not one of: payload, total"):
        load_run_config(TINY, [*VIRTUAL_PIPELINE, "--pipeline.compression_of", "bytes"])
