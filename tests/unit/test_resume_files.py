"""Automatic resume's file handling (issue 11): metrics.jsonl cut back to the checkpoint, pruning, --fresh."""

from __future__ import annotations

import json

from slimpar.config import Config, load_config
from slimpar.train.checkpoint.dcp import prune_checkpoints
from slimpar.train.checkpoint.folders import latest_checkpoint
from slimpar.train.launch.launcher import FRESH_DELETES, prepare_out_dir
from slimpar.train.sinks.metrics import MetricsWriter
from tests.helpers import TINY


def _step_dirs(root, steps, complete=True):
    for s in steps:
        d = root / "checkpoints" / f"step_{s:06d}"
        d.mkdir(parents=True)
        (d / "shard.distcp").write_bytes(b"x")
        if complete:
            (d / "trainer.json").write_text(json.dumps({"step": s}))


def test_metrics_are_cut_back_to_the_resumed_step(tmp_path):
    w = MetricsWriter(tmp_path, enabled=True)
    for step in range(1, 7):
        w.write({"step": step, "loss": float(step)})
    with open(w.path, "a") as f:
        f.write('{"step": 7, "lo')  # a line cut short by the kill
    w.truncate(4)
    assert [json.loads(line)["step"] for line in w.path.read_text().splitlines()] == [1, 2, 3, 4]
    w.truncate(0)
    assert w.path.read_text() == ""
    MetricsWriter(tmp_path / "absent", enabled=True).truncate(3)  # no file: nothing to do


def test_prune_keeps_the_newest_complete_checkpoints(tmp_path):
    _step_dirs(tmp_path, [2, 4, 6, 8])
    _step_dirs(tmp_path, [3, 10], complete=False)  # interrupted saves: 3 is older than the kept ones, 10 newer
    gone = prune_checkpoints(tmp_path, keep_last=2)
    # every interrupted save goes (a crash or a full disk left it; it is never resumed from)
    assert sorted(d.name for d in gone) == ["step_000002", "step_000003", "step_000004", "step_000010"]
    left = sorted(d.name for d in (tmp_path / "checkpoints").iterdir())
    assert left == ["step_000006", "step_000008"]
    assert latest_checkpoint(tmp_path).name == "step_000008"
    assert prune_checkpoints(tmp_path, keep_last=1)[0].name == "step_000006"
    assert latest_checkpoint(tmp_path).name == "step_000008"  # the newest complete one is never deleted
    assert prune_checkpoints(tmp_path, keep_last=0) == []
    _step_dirs(tmp_path, [9], complete=False)
    assert [d.name for d in prune_checkpoints(tmp_path, keep_last=0)] == ["step_000009"]  # keep all: partials go


def test_defaults_resume_and_fresh_deletes_only_old_outputs(tmp_path):
    cfg = load_config(TINY)
    assert cfg.checkpoint.resume and cfg.checkpoint.every == 100 and cfg.checkpoint.keep_last == 2
    old = "[checkpoint]\nresume = true\nevery = 5\n"  # a TOML written before resume became the default
    (tmp_path / "old.toml").write_text(old)
    assert load_config(tmp_path / "old.toml").checkpoint.resume is True
    _step_dirs(tmp_path, [2])
    for name in FRESH_DELETES[1:]:
        (tmp_path / name).write_text("old")
    (tmp_path / "tokenizer.json").write_text("kept")
    prepare_out_dir(Config(), tmp_path)  # resume (the default): nothing deleted
    assert latest_checkpoint(tmp_path) is not None and (tmp_path / "metrics.jsonl").exists()
    fresh = Config()
    fresh.checkpoint.resume = False
    prepare_out_dir(fresh, tmp_path)
    assert not any((tmp_path / name).exists() for name in FRESH_DELETES)
    assert (tmp_path / "tokenizer.json").read_text() == "kept" and (tmp_path / "config.toml").exists()
