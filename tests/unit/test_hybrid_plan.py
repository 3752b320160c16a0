"""The SDP × MAPL hybrid's start-up rules and per-stage plans (no process group needed)."""

from __future__ import annotations

import pytest
import torch

from slimpar.config import ConfigError
from slimpar.hybrid import stage_plans
from slimpar.models.llama import Llama, LlamaConfig
from slimpar.pipeline.split import stage_ranges
from slimpar.train.validate.checks import load_run_config
from tests.helpers import TINY

GOOD = ["--parallel.mode", "pipeline", "--parallel.workers", "4", "--pipeline.stages", "2",
        "--pipeline.microbatches", "2"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--pipeline.sdp_keep", "0.5"], "add --pipeline.dp sdp"),
    (["--pipeline.dp", "sdp", "--pipeline.sdp_keep", "0"], "pipeline.sdp_keep"),
    (["--pipeline.dp", "sdp", "--pipeline.sdp_keep", "1.5"], "pipeline.sdp_keep"),
    (["--pipeline.dp", "fsdp"], "pipeline.dp"),
    (["--parallel.workers", "1", "--pipeline.virtual", "true", "--pipeline.dp", "sdp"], "one replica"),
])
def test_bad_hybrid_settings_are_rejected(extra: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_run_config(TINY, [*GOOD, *extra])


def test_good_hybrid_settings_load() -> None:
    cfg = load_run_config(TINY, [*GOOD, "--pipeline.dp", "sdp", "--pipeline.sdp_keep", "0.5"])
    assert cfg.pipeline.dp == "sdp" and cfg.pipeline.sdp_keep == 0.5


def test_stage_plans_cover_each_stage_and_name_stage_parameters() -> None:
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny(vocab_size=256, n_layers=8))
    names = {n for n, _ in model.named_parameters()}
    plans = stage_plans(model, 2, 4, 0.5)
    for plan, blocks in zip(plans, stage_ranges(8, 2), strict=True):
        assert [c.name for c in plan.components] == [f"model.layers.{i}" for i in blocks]
        assert all(p.removeprefix("model.") in names for c in plan.components for p in c.params)
        assert plan.world_size == 4 and min(plan.holders_per_component) >= 1
        assert all(k == 0.5 for k in plan.keep_per_worker)
    one = stage_plans(model, 2, 1, 0.5)  # one replica: keep forced to 1, SDP is a no-op
    assert all(p.mask.all() for p in one)
