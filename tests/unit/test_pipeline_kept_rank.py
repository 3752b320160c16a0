"""A resumed pipeline keeps its checkpoint's codec rank r. With ``compression_of = total`` (the default) r follows
a replica's rows per microbatch, so the same settings on fewer workers choose another r (llama_tiny, 2 stages:
r = 14 with 2 replicas, 15 with 1) and could not load the codecs they trained: an automatic ``pipeline.rank``
becomes the r the checkpoint's projectors have (read from its DCP metadata), another explicit one is refused. The
multi-process resume is in tests/distributed/test_resume_pipelines.py."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from slimpar.config import ConfigError, load_config, to_toml
from slimpar.train.checkpoint.layout import LAYOUT, check_layout, checkpoint_layout, keep_checkpoint_settings
from slimpar.train.checkpoint.pipeline import saved_rank
from slimpar.train.launch.rerun import check_rerun
from slimpar.train.run_plan import run_plan
from tests.helpers import TINY

HYBRID = ["--parallel.mode", "pipeline", "--pipeline.stages", "2", "--pipeline.microbatches", "2",
          "--pipeline.codec", "mapl", "--pipeline.dp", "sdp", "--pipeline.sdp_keep", "0.5"]


def _cfg(workers: int, *extra: str):
    return load_config(TINY, [*HYBRID, "--parallel.workers", str(workers), *extra])


def _checkpoint(tmp_path, cfg, r: int):
    """A checkpoint folder with ``cfg``'s layout.json and DCP metadata of one cut's projectors at rank r."""
    path = tmp_path / "checkpoints" / "step_000002"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's note that it saves in one process
        dcp.save({f"model.codecs.cut1.{end}.projector.A": torch.zeros(64, r) for end in ("send", "recv")},
                 checkpoint_id=str(path))
    (path / LAYOUT).write_text(json.dumps(checkpoint_layout(cfg)))
    return path


def test_r_follows_the_replicas():
    assert [run_plan(_cfg(w)).codecs[0].rank for w in (4, 2)] == [14, 15]


def test_a_resume_on_fewer_workers_keeps_the_checkpoints_r(tmp_path):
    path = _checkpoint(tmp_path, _cfg(4), 14)
    assert saved_rank(path) == 14
    cfg = _cfg(2)
    note = keep_checkpoint_settings(cfg, path)
    assert cfg.pipeline.rank == 14 and "keeps its checkpoint's codec rank r = 14" in note
    assert run_plan(cfg).codecs[0].rank == 14
    check_layout(path, checkpoint_layout(cfg))  # the tied settings: the same codec
    (tmp_path / "config.toml").write_text(to_toml(_cfg(4)))  # what the first launch wrote (rank automatic)
    check_rerun(tmp_path, cfg, path, 2, allow=False)  # the old config keeps the r too: no change of settings
    same = _cfg(2, "--pipeline.rank", "14")
    assert keep_checkpoint_settings(same, path) == "" and same.pipeline.rank == 14


def test_another_explicit_rank_at_a_kept_cut_is_refused(tmp_path):
    path = _checkpoint(tmp_path, _cfg(4), 14)
    with pytest.raises(ConfigError, match=r"rank r = 14, this run asks --pipeline.rank 12.*--pipeline.rank 14"):
        keep_checkpoint_settings(_cfg(2, "--pipeline.rank", "12"), path)


@pytest.mark.parametrize("case", ["another codec", "no kept cut"])
def test_another_codec_or_no_kept_cut_is_left_alone(tmp_path, case):
    path = _checkpoint(tmp_path, _cfg(4), 14)
    cfg = _cfg(2, "--pipeline.codec", "ssn") if case == "another codec" else _cfg(2)
    if case == "no kept cut":
        layout = json.loads((path / LAYOUT).read_text())
        layout["pipeline"]["cuts"] = [2]  # a checkpoint whose only cut (after block 2) this 2-stage run lacks
        (path / LAYOUT).write_text(json.dumps(layout))
    assert keep_checkpoint_settings(cfg, path) == "" and cfg.pipeline.rank == 0
