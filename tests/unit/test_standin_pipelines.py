"""The pipeline with every codec (both stages), the virtual pipeline with every codec and the SDP x pipeline hybrid
with and without a projector (all four ranks) on the stand-in accelerator (tests/standin_run.py): steps with the
shared-parameter exchange and checksums every step, the logged loss, the clip in every ``pipeline.clip_projector``
mode, evaluation through the stages, export and checkpoint state, every collective and send refused a host tensor
and a host scalar refused where CUDA refuses one (docs/gpu.md). On 1586a30 each failed at its first step; before
issue 46's fix, every rank without a projector of its own failed at the clip (a CPU zero in ``torch.stack``)."""

import pytest

from tests.unit.test_standin_data_parallel import GROUPS, check_mode, run_modes

CODECS = ["none", "bf16", "int8", "mapl", "mapl-rvq", "ssn", "naive"]
VIRTUAL = {c: "pipeline-virtual" if c == "mapl" else f"pipeline-virtual-{c}" for c in CODECS}
MODES = [*[f"pipeline-{c}" for c in CODECS], *VIRTUAL.values(), "hybrid", "hybrid-none"]

@pytest.fixture(scope="module")
def results() -> dict[str, list[dict]]:
    return run_modes(MODES)


@pytest.mark.parametrize("mode", MODES)
def test_mode_on_the_stand_in_accelerator(results, mode):
    from slimpar.pipeline.training import CLIP_MODES
    from tests.standin_run import config

    check_mode(results[mode], config(mode).parallel.workers)  # every rank returns the all-reduced metrics
    for r in results[mode]:  # every clip mode ran, and its norm stayed on the device
        assert r["clip"] == dict.fromkeys(CLIP_MODES, "meta"), f"rank {r['rank']}: {r['clip']}"


def test_every_codec_runs_on_both_pipelines():
    from slimpar.pipeline.codec_kinds import CODEC_KINDS
    from tests.standin_run import CODECS as ARGS
    from tests.standin_run import MODES as ALL

    assert sorted(ARGS) == sorted(CODECS) and set(CODEC_KINDS) <= set(CODECS)
    for codec in CODECS:
        for mode in (f"pipeline-{codec}", VIRTUAL[codec]):
            args = ALL[mode]
            assert any(args[i:i + len(ARGS[codec])] == ARGS[codec] for i in range(len(args))), (mode, codec)

def test_every_stand_in_mode_is_tested():
    from tests.standin_run import MODES as ALL

    assert sorted([m for g in GROUPS for m in g] + MODES) == sorted(ALL)
