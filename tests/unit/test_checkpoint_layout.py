"""Which checkpoints a run may resume from (``check_layout``), and what its error names when it may not."""

from __future__ import annotations

import json

import pytest

from slimpar.config import ConfigError
from slimpar.train.checkpoint.layout import LAYOUT, check_layout, checkpoint_layout
from slimpar.train.validate.checks import load_run_config
from tests.helpers import TINY, VIRTUAL_PIPELINE

MAPL = [*VIRTUAL_PIPELINE, "--pipeline.codec", "mapl", "--pipeline.stages", "2"]


def _layout(*overrides: str) -> dict:
    return checkpoint_layout(load_run_config(TINY, [*MAPL, *overrides]))


def _written(tmp_path, layout: dict):
    (tmp_path / LAYOUT).write_text(json.dumps(layout))
    return tmp_path


def test_a_field_that_shapes_no_tensor_does_not_tie_the_checkpoint(tmp_path):
    saved = _written(tmp_path, _layout("--pipeline.rvq.decay", "0.9", "--pipeline.rvq.dead_threshold", "0.01"))
    check_layout(saved, _layout())  # RVQ's EMA settings shape no tensor


def test_a_checkpoint_of_an_older_slimpar_that_tied_other_fields_still_loads(tmp_path):
    old = _layout()
    old["pipeline"]["rvq"] = {"codebook": 256, "commitment": 0.25, "decay": 0.99, "levels": 0, "sync_every": 50}
    check_layout(_written(tmp_path, old), _layout())  # written before rvq.dead_threshold existed


@pytest.mark.parametrize(("overrides", "named"), [
    (["--pipeline.compression", "8"], "pipeline.compression: checkpoint 4, this run 8"),
    (["--pipeline.rvq.levels", "2"], "pipeline.rvq.levels: checkpoint 0, this run 2"),
    (["--train.seed", "3"], "seed: checkpoint 0, this run 3"),
])
def test_a_tied_field_that_differs_is_named_with_both_values(tmp_path, overrides, named):
    saved = _written(tmp_path, _layout())
    with pytest.raises(ConfigError, match="a layout its checkpoint is tied to") as e:
        check_layout(saved, _layout(*overrides))
    assert named in str(e.value) and "--fresh" in str(e.value)


def test_virtual_and_real_sdp_checkpoints_load_into_each_other(tmp_path):
    """Virtual SDP writes the full-name format too (slimpar.train.checkpoint.sdp.VirtualSDPFullState)."""
    sdp = ["--parallel.mode", "sdp", "--sdp.level", "neuron"]
    real = checkpoint_layout(load_run_config(TINY, [*sdp, "--parallel.workers", "4"]))
    virtual = checkpoint_layout(load_run_config(TINY, [*sdp, "--parallel.workers", "1", "--sdp.virtual", "true",
                                                       "--sdp.virtual_workers", "2"]))
    assert real["names"] == virtual["names"] == "full"
    check_layout(_written(tmp_path, real), virtual)
    check_layout(_written(tmp_path, virtual), real)
    old = dict(virtual, names="sdp-virtual")  # an older slimpar's per-worker names
    with pytest.raises(ConfigError, match="cannot load"):
        check_layout(_written(tmp_path, old), virtual)


def _pipe(stages: int, *overrides: str, virtual: bool = True) -> dict:
    where = [] if virtual else ["--pipeline.virtual", "false", "--parallel.workers", str(stages)]
    return _layout("--pipeline.stages", str(stages), *where, *overrides)


def test_a_pipeline_checkpoint_loads_into_another_stage_count_virtual_or_not(tmp_path):
    four = _pipe(4)
    assert four["names"] == "pipeline-full" and four["pipeline"]["cuts"] == [0, 1, 2]  # llama_tiny: 4 blocks
    check_layout(_written(tmp_path, four), _pipe(2))
    check_layout(_written(tmp_path, four), _pipe(2, virtual=False))
    hybrid = _layout("--pipeline.stages", "2", "--pipeline.virtual", "false", "--parallel.workers", "4",
                     "--pipeline.dp", "sdp", "--pipeline.sdp_keep", "0.5")
    check_layout(_written(tmp_path, _pipe(3, virtual=False)), hybrid)  # 3 stages x DDP -> 2 stages x SDP


def test_another_codec_at_a_kept_cut_is_refused_and_named(tmp_path):
    saved = _written(tmp_path, _pipe(4))
    with pytest.raises(ConfigError, match="another codec at the cut after block 1,") as e:
        check_layout(saved, _pipe(2, "--pipeline.compression", "8"))
    assert "pipeline.compression: checkpoint 4, this run 8" in str(e.value)
    with pytest.raises(ConfigError, match="seed: checkpoint 0, this run 3"):
        check_layout(saved, _pipe(2, "--train.seed", "3"))


def test_an_older_stage_local_pipeline_checkpoint_loads_only_into_its_own_layout(tmp_path):
    old = dict(_pipe(4), names="pipeline")
    del old["pipeline"]["cuts"]  # an older slimpar wrote no cuts
    check_layout(_written(tmp_path, old), _pipe(4))
    with pytest.raises(ConfigError, match="older slimpar's pipeline checkpoint, under stage-local names") as e:
        check_layout(_written(tmp_path, old), _pipe(2))
    assert "stages: checkpoint 4, this run 2" in str(e.value)
