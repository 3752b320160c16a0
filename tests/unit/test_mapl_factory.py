"""The library's MAPL is the CLI's: ``CodecSpec.mapl(d, K, vocab=V)`` equals, field by field, the spec that
``slimpar train --parallel.mode pipeline --pipeline.codec mapl --pipeline.compression K`` builds for each boundary
(the trainer's own path, ``codec_specs``), with and without RVQ; and the defaults both read are one record."""

from __future__ import annotations

import dataclasses

import pytest

from slimpar.codec_defaults import CODEC_DEFAULTS
from slimpar.config import PipelineConfig, RVQConfig
from slimpar.pipeline import CodecSpec
from slimpar.train.strategies.pipeline_specs import codec_specs
from slimpar.train.validate.checks import load_run_config

D, V = 128, 4096  # the model width and vocabulary both paths are given


def _cli_specs(compression: int, *extra: str) -> tuple[list[CodecSpec], int]:
    """The specs the CLI command builds (its validated config, as `slimpar train` loads it), and its microbatches."""
    cfg = load_run_config(overrides=["--parallel.mode", "pipeline", "--parallel.workers", "4", "--pipeline.stages",
                                     "4", "--pipeline.codec", "mapl", "--pipeline.compression", str(compression),
                                     *extra], data=False)
    return codec_specs(cfg, D, V), cfg.pipeline.microbatches


@pytest.mark.parametrize("rvq_levels", [0, 2])
@pytest.mark.parametrize("compression", [4, 8, 16])
def test_factory_equals_the_cli_field_by_field(compression, rvq_levels):
    cli, microbatches = _cli_specs(compression, "--pipeline.rvq.levels", str(rvq_levels))
    assert len(cli) == 3  # 4 stages: boundaries 0, 1, 2
    for want in cli:
        got = CodecSpec.mapl(D, compression, vocab=V, boundary=want.boundary, seed=0, rvq_levels=rvq_levels,
                             microbatches=microbatches)
        for f in dataclasses.fields(CodecSpec):
            assert getattr(got, f.name) == getattr(want, f.name), (f.name, compression, rvq_levels)
    # what the study kept, spelled out: a change of default must be a change of this record, not of one path
    spec = cli[0]
    assert (spec.rank, spec.anchors, spec.anchor_form, spec.ids_on_wire, spec.projector_init) == \
        (D // compression, "factorized", "receiver", False, "pca")
    assert (spec.rvq is not None) == bool(rvq_levels)


def test_overrides_take_the_sections_terms_and_match_the_cli():
    cli, mb = _cli_specs(8, "--pipeline.ids", "send", "--pipeline.anchor_form", "symmetric",
                         "--pipeline.projector_init", "random")
    got = CodecSpec.mapl(D, 8, vocab=V, microbatches=mb, ids="send", anchor_form="symmetric", projector_init="random")
    assert got == cli[0]


def test_the_sections_defaults_are_the_one_record():
    pc, q = PipelineConfig(), RVQConfig()
    for name in ("anchors", "anchor_dim", "anchor_form", "anchor_init", "ids", "projector_init"):
        assert getattr(pc, name) == getattr(CODEC_DEFAULTS, name), name
    assert dataclasses.asdict(CODEC_DEFAULTS.rvq) == {k: v for k, v in dataclasses.asdict(q).items() if k != "levels"}


def test_the_low_level_constructor_keeps_its_own_defaults():
    spec = CodecSpec("mapl", boundary=0, dim=D, rank=32, vocab=V, seed=0)
    assert (spec.anchors, spec.ids_on_wire, spec.projector_init) == ("none", True, "random")


def test_an_unknown_ids_choice_is_an_error():
    with pytest.raises(ValueError, match="ids"):
        CodecSpec.mapl(D, 4, vocab=V, ids="sent")
