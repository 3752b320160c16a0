"""The library's MAPL is the CLI's: ``CodecSpec.mapl(d, K, vocab=V, step=...)`` equals, field by field, the spec
that ``slimpar train --parallel.mode pipeline --pipeline.codec mapl --pipeline.compression K`` builds for each
boundary (the trainer's own path, ``codec_specs``), with and without RVQ, in both meanings of K: with the step's
shape, every byte <= 1/K of ``none``'s (the CLI's default); without it, r = d / K (``compression_of payload``). The
defaults both read are one record."""

from __future__ import annotations

import dataclasses

import pytest

from slimpar.codec_defaults import CODEC_DEFAULTS
from slimpar.config import PipelineConfig, RVQConfig
from slimpar.pipeline import CodecSpec, StepShape
from slimpar.pipeline.training import MaplTrainingSpec
from slimpar.train.strategies.pipeline_specs import codec_specs, step_shape, training_spec
from slimpar.train.validate.checks import load_run_config

D, V = 128, 4096  # the model width and vocabulary both paths are given


def _cli(compression: int, *extra: str):
    """The config the CLI command loads (validated, as `slimpar train` loads it) and the specs it builds."""
    cfg = load_run_config(overrides=["--parallel.mode", "pipeline", "--parallel.workers", "4", "--pipeline.stages",
                                     "4", "--pipeline.codec", "mapl", "--pipeline.compression", str(compression),
                                     *extra], data=False)
    return cfg, codec_specs(cfg, D, V)


def _cli_specs(compression: int, *extra: str) -> tuple[list[CodecSpec], int]:
    """The specs the CLI command builds and its microbatches."""
    cfg, specs = _cli(compression, *extra)
    return specs, cfg.pipeline.microbatches


def _assert_fields_equal(got: CodecSpec, want: CodecSpec, *why) -> None:
    for f in dataclasses.fields(CodecSpec):
        assert getattr(got, f.name) == getattr(want, f.name), (f.name, *why)


def _total_rank(compression: int) -> int:
    """By hand: the default config's step is 4 microbatches of 4 × 128 tokens (2,048), so none sends
    2,048 · 128 · 4 = 1,048,576 bytes per boundary each way. At rank r MAPL (local ids, receiver anchors) sends
    the payload 2,048 · r · 4 each way plus A's int8 gradient part (128 · r int8 + 128 fp32 scales) and its
    checksum (8 bytes every 50 steps): 8,320 r + 512.16 <= 1,048,576 / K."""
    return int((1_048_576 / compression - 512 - 8 / 50) // 8_320)


@pytest.mark.parametrize("rvq_levels", [0, 2])
@pytest.mark.parametrize("compression", [4, 8, 16])
def test_factory_equals_the_cli_field_by_field(compression, rvq_levels):
    cfg, cli = _cli(compression, "--pipeline.rvq.levels", str(rvq_levels))
    assert len(cli) == 3  # 4 stages: boundaries 0, 1, 2
    step = step_shape(cfg)
    assert step == StepShape(4, 128, 4)
    for want in cli:
        got = CodecSpec.mapl(D, compression, vocab=V, step=step, boundary=want.boundary, seed=0, rvq_levels=rvq_levels)
        _assert_fields_equal(got, want, compression, rvq_levels)
    # what the study kept, spelled out: a change of default must be a change of this record, not of one path
    spec = cli[0]
    assert (spec.rank, spec.anchors, spec.anchor_form, spec.ids_on_wire, spec.projector_init) == \
        (_total_rank(compression), "factorized", "receiver", False, "pca")
    assert (_total_rank(4), _total_rank(8), _total_rank(16)) == (31, 15, 7)  # under d / K: 32, 16, 8
    assert (spec.rvq is not None) == bool(rvq_levels)


@pytest.mark.parametrize("rvq_levels", [0, 2])
@pytest.mark.parametrize("compression", [4, 8, 16])
def test_factory_without_a_step_is_the_payload_meaning(compression, rvq_levels):
    cli, microbatches = _cli_specs(compression, "--pipeline.rvq.levels", str(rvq_levels),
                                   "--pipeline.compression_of", "payload")
    for want in cli:
        got = CodecSpec.mapl(D, compression, vocab=V, boundary=want.boundary, seed=0, rvq_levels=rvq_levels,
                             microbatches=microbatches)
        _assert_fields_equal(got, want, compression, rvq_levels)
    assert cli[0].rank == D // compression


def test_a_budget_no_rank_meets_is_an_error_in_both():
    step = StepShape(1, 4, 1)  # 4 tokens: none sends 2,048 bytes, A's gradient part alone is over 1/16 of it
    with pytest.raises(ValueError, match="even rank 1"):
        CodecSpec.mapl(D, 16, vocab=V, step=step)
    with pytest.raises(ValueError, match="microbatches"):
        CodecSpec.mapl(D, 4, vocab=V, step=step, microbatches=2)


@pytest.mark.parametrize(("meaning", "compression"), [("payload", 8), ("total", 4)])
def test_overrides_take_the_sections_terms_and_match_the_cli(meaning, compression):
    # (at 8x of the total, the symmetric table's rows alone would break the budget of the validated d = 64)
    cfg, cli = _cli(compression, "--pipeline.ids", "send", "--pipeline.anchor_form", "symmetric",
                    "--pipeline.projector_init", "random", "--pipeline.compression_of", meaning)
    step = step_shape(cfg) if meaning == "total" else None
    got = CodecSpec.mapl(D, compression, vocab=V, step=step, microbatches=cfg.pipeline.microbatches, ids="send",
                         anchor_form="symmetric", projector_init="random")
    assert got == cli[0]
    if meaning == "total":  # the ids and the symmetric table's rows count too: r falls well under d / K
        assert got.rank < _total_rank(compression) < D // compression


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


def test_the_library_optimizer_spec_is_the_clis():
    """``MaplTrainingSpec(lr=...)`` steps A and the rest as the CLI's default pipeline does: every field the user
    did not give equals the one ``slimpar train`` builds, except those the trainer fills from the run itself."""
    cfg, _ = _cli(4)
    cli = training_spec(cfg)
    lib = MaplTrainingSpec(lr=cfg.train.lr)
    for f in dataclasses.fields(MaplTrainingSpec):
        if f.name not in ("total_steps", "batch_spel"):  # the run's length; one process or several
            assert getattr(lib, f.name) == getattr(cli, f.name), f.name
    assert (lib.spel_lr, lib.spel_schedule, lib.clip) == (0.001, "constant", "separate")  # docs/methods.md, 'SPEL'
