"""The run plan (slimpar/train/run_plan.py): one per process for a config, its parts built once and equal to what
the library computes from the same settings."""

from __future__ import annotations

from slimpar.config import from_dict, load_config, to_dict
from slimpar.train.run_plan import run_plan
from slimpar.train.strategies import sdp_plan
from tests.helpers import TINY, VIRTUAL_PIPELINE

SDP = ["--parallel.mode", "sdp", "--parallel.workers", "4", "--sdp.keep", "0.5"]


def test_one_plan_per_config_and_its_sdp_plan_built_once():
    cfg = load_config(TINY, [*SDP, "--train.seed", "11"])
    run = run_plan(cfg)
    before = sdp_plan.builds
    first = run.sdp
    again = run_plan(from_dict(to_dict(cfg))).sdp  # the config a worker receives: the same plan, not rebuilt
    assert again is first and sdp_plan.builds == before + 1
    assert run_plan(load_config(TINY, [*SDP, "--train.seed", "12"])) is not run


def test_a_later_change_to_the_config_does_not_change_its_plan():
    cfg = load_config(TINY, [*SDP, "--train.seed", "13"])
    run = run_plan(cfg)
    cfg.parallel.workers = 2
    assert run.cfg.parallel.workers == 4 and run.sdp.world_size == 4


def test_the_sdp_plan_is_the_librarys():
    cfg = load_config(TINY, [*SDP, "--train.seed", "14"])
    run = run_plan(cfg)
    direct = sdp_plan.plan_from_config(cfg, run.meta_model, 4)
    assert (run.sdp.mask == direct.mask).all() and run.sdp.keep_per_worker == direct.keep_per_worker


def test_the_codecs_are_the_configs_specs():
    from slimpar.train.strategies.pipeline_specs import codec_specs

    cfg = load_config(TINY, [*VIRTUAL_PIPELINE, "--pipeline.codec", "mapl", "--data.vocab_size", "512"])
    run = run_plan(cfg, 512)
    assert run.codecs == codec_specs(cfg, run.meta_model.cfg.dim, 512)
    assert [s.boundary for s in run.codecs] == list(range(cfg.pipeline.stages - 1))
    from slimpar.pipeline.split import stage_ranges

    ranges = stage_ranges(run.meta_model.cfg.n_layers, cfg.pipeline.stages)
    assert run.cuts == [r[-1] for r in ranges[:-1]]  # the last block before each boundary
