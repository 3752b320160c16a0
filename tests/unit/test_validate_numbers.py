"""Every numeric config field is checked for finiteness and range before anything starts (issue 11).

NaN and inf slip past ``x < 0`` checks, so each malformed value here must raise a ConfigError that
names the field; a few go through the real CLI: exit 2, one ``slimpar: error:`` line, nothing written.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from slimpar.config import Config, ConfigError
from slimpar.train.guard import StepGuard, TrainingDiverged, check_export
from slimpar.train.validate.checks import all_ranges, load_run_config, numeric_fields
from tests.helpers import ROOT, TINY

BAD = [
    # [train]
    ("train.lr", "nan"), ("train.lr", "inf"), ("train.lr", "-inf"), ("train.lr", "0"), ("train.lr", "-1e-3"),
    ("train.min_lr_ratio", "-5"), ("train.min_lr_ratio", "1.5"), ("train.min_lr_ratio", "nan"),
    ("train.beta1", "1"), ("train.beta1", "-0.1"), ("train.beta1", "nan"),
    ("train.beta2", "1.0"), ("train.beta2", "2"), ("train.beta2", "inf"),
    ("train.weight_decay", "-0.1"), ("train.weight_decay", "nan"),
    ("train.grad_clip", "nan"), ("train.grad_clip", "inf"), ("train.grad_clip", "-1"),
    ("train.steps", "-3"), ("train.batch_size", "-8"), ("train.warmup_steps", "-1"), ("train.grad_accum", "0"),
    ("train.seed", "-1"), ("train.stop_after", "-1"), ("train.skip_bad_steps", "-2"),
    # [model] and [data]
    ("model.n_kv_heads", "-1"), ("model.vocab_size", "-5"), ("model.max_seq_len", "-1"),
    ("model.num_classes", "0"), ("model.width", "-64"), ("model.embed_dim", "0"), ("model.in_channels", "0"),
    ("data.heldout_works", "-1"), ("data.seq_len", "-64"), ("data.vocab_size", "-512"),
    # [parallel]
    ("parallel.timeout_s", "0"), ("parallel.timeout_s", "-5"), ("parallel.timeout_s", "nan"),
    ("parallel.timeout_s", "inf"),
    # [eval], [checkpoint], [log]
    ("eval.batch_size", "100000"), ("eval.batch_size", "-1"), ("eval.batches", "0"), ("eval.every", "-2"),
    ("checkpoint.every", "-10"), ("log.every", "0"), ("log.measure_step", "-1"),
    # [sdp] (checked in every mode: a wrong value is a mistake even where unused)
    ("sdp.keep", "0"), ("sdp.keep", "1.5"), ("sdp.keep", "nan"), ("sdp.keep", "-0.5"),
    ("sdp.keep_per_worker", "0.5,nan"), ("sdp.keep_per_worker", "0.5,2"), ("sdp.min_holders", "0"),
    ("sdp.groups", "-1"), ("sdp.check_every", "-1"), ("sdp.fsdp", "0"), ("sdp.bn_recalibrate", "-2"),
    # [pipeline]
    ("pipeline.spel_lr", "nan"), ("pipeline.spel_lr", "inf"), ("pipeline.spel_lr", "-0.01"),
    ("pipeline.spel_momentum", "1"), ("pipeline.spel_momentum", "nan"), ("pipeline.microbatches", "0"),
    ("pipeline.rank", "-1"), ("pipeline.checksum_every", "-1"), ("pipeline.anchor_dim", "0"),
    ("pipeline.rvq.decay", "nan"), ("pipeline.rvq.decay", "1"), ("pipeline.rvq.commitment", "-inf"),
    ("pipeline.rvq.levels", "-1"), ("pipeline.rvq.sync_every", "-1"),
]


@pytest.mark.parametrize("field, value", BAD, ids=[f"{f}={v}" for f, v in BAD])
def test_malformed_number_names_the_field(field, value):
    with pytest.raises(ConfigError) as info:
        load_run_config(TINY, [f"--{field}", value])
    message = str(info.value)
    assert field in message and ("finite" in message or "must be" in message), message


def test_every_numeric_field_has_a_rule():
    """A new numeric field must get a range in validate.py, validate_sdp.py or validate_pipeline.py."""
    fields, rules = set(numeric_fields(Config())), set(all_ranges())
    assert fields == rules, (fields - rules, rules - fields)


def test_messages_name_value_and_fix():
    with pytest.raises(ConfigError, match=r"train.min_lr_ratio must be in \[0, 1\], got -5.0 .*--train.min_lr_ratio"):
        load_run_config(TINY, ["--train.min_lr_ratio", "-5"])
    with pytest.raises(ConfigError, match="train.lr = nan is not a finite number.*--train.lr 0.003"):
        load_run_config(TINY, ["--train.lr", "nan"])


def test_boundary_values_are_accepted():
    cfg = load_run_config(TINY, ["--train.min_lr_ratio", "0", "--train.beta1", "0", "--sdp.keep", "1",
                                 "--train.grad_clip", "0", "--eval.batch_size", "8", "--train.skip_bad_steps", "3",
                                 "--parallel.timeout_s", "0.5"])
    assert cfg.train.skip_bad_steps == 3 and cfg.parallel.timeout_s == 0.5


@pytest.mark.parametrize("args", [["--train.lr", "nan"], ["--pipeline.spel_lr", "inf"],
                                  ["--train.min_lr_ratio", "-5"], ["--train.stop_after", "-1"]])
def test_cli_exits_2_with_one_line_and_writes_nothing(tmp_path, args):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "slimpar", "train", "--config", str(TINY), "--out", str(out),
                           *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slimpar: error: ") and args[0][2:] in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_guard_skips_within_budget_then_stops():
    guard = StepGuard(skip_budget=2, group=None, lr=1e6)
    assert guard.check(0, 5.0, 1.0)
    assert not guard.check(1, math.nan, 1.0) and not guard.check(2, 5.0, math.inf)
    assert guard.skipped == [2, 3]
    with pytest.raises(TrainingDiverged, match=r"step 4 after skipping 2 bad step\(s\).*lower --train.lr"):
        guard.check(3, math.inf, None)


def test_guard_sees_non_finite_gradients_without_a_norm():
    """grad_clip = 0 computes no norm: the gradients themselves are checked."""
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([0.0, math.nan, 1.0])
    with pytest.raises(TrainingDiverged, match="non-finite gradients"):
        StepGuard(0, None, 1e-3).check(0, 2.0, None, [p])


def test_export_refuses_non_finite_weights():
    check_export({"w": torch.ones(2), "ids": torch.arange(3)})
    with pytest.raises(TrainingDiverged, match=r"1 non-finite weights.*w \(1\)"):
        check_export({"w": torch.tensor([1.0, math.inf])})
