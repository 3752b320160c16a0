"""Evaluation against hand computations: the split's loss, its two disjoint halves (the noise floor), the
tokens scored, and the end-of-run evaluation's larger set (``eval.final_tokens``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from slimpar.train.build import build_data, build_model, final_eval_config
from slimpar.train.evaluate import evaluate, val_splits
from slimpar.train.strategies.base import Strategy
from slimpar.train.validate.checks import load_run_config
from tests.helpers import ROOT, TINY

BASE = ["--eval.batches", "3", "--eval.batch_size", "4", "--data.ood", "none"]


@pytest.fixture(scope="module")
def setup():
    cfg = load_run_config(TINY, BASE)
    data = build_data(cfg)
    torch.manual_seed(0)
    return cfg, data, build_model(cfg, data)


def _mean_ce(model, batches) -> float:
    """Mean cross-entropy over every target token of ``batches``, computed in float64 by hand."""
    with torch.no_grad():
        logits = torch.cat([model(x) for x, _ in batches]).double()
        y = torch.cat([y for _, y in batches])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()


def test_halves_are_the_loss_of_two_disjoint_halves_of_the_batches(setup) -> None:
    cfg, data, model = setup
    model.eval()
    batches = val_splits(data, cfg)["heldout"]
    assert len(batches) == 3
    got = evaluate(Strategy(model), data, cfg, 0, 1)
    assert got["val_loss"] == pytest.approx(_mean_ce(model, batches), rel=1e-5)
    assert got["val_loss_half1"] == pytest.approx(_mean_ce(model, batches[:2]), rel=1e-5)  # ceil(3 / 2) batches
    assert got["val_loss_half2"] == pytest.approx(_mean_ce(model, batches[2:]), rel=1e-5)
    assert got["val_loss_half1"] != got["val_loss_half2"]  # different text: the halves measure something
    assert got["val_tokens"] == 3 * 4 * cfg.data.seq_len


def test_final_tokens_reads_more_and_a_short_split_whole(setup, tmp_path) -> None:
    cfg, _, _ = setup
    assert final_eval_config(cfg) is cfg  # 0: the end of the run evaluates like every other evaluation
    more = load_run_config(TINY, [*BASE, "--eval.final_tokens", "1000"])
    final = final_eval_config(more)
    assert final.eval.batches == 4  # ceil(1000 / (4 sequences x 64 tokens))
    assert more.eval.batches == 3  # the evaluations on the way keep theirs
    # a short split (the held-out tail of this project's pipeline page: 17 windows today), read whole
    short = ["--data.corpus", "path", "--data.path", str(ROOT / "docs" / "pipeline.md")]
    whole = final_eval_config(load_run_config(TINY, [*BASE, *short, "--eval.final_tokens", str(10**9)]))
    data = build_data(whole)
    torch.manual_seed(0)
    model = build_model(whole, data)
    stream = data.val_streams["heldout"]
    batches = val_splits(data, whole)["heldout"]
    n_windows = (len(stream) - 1) // whole.data.seq_len
    assert n_windows > 3 * 4  # longer than the evaluations on the way read
    assert sum(len(x) for x, _ in batches) == n_windows  # every non-overlapping window of the split, once
    got = evaluate(Strategy(model), data, whole, 0, 1)
    assert got["val_tokens"] == n_windows * whole.data.seq_len
    assert got["val_loss"] == pytest.approx(_mean_ce(model, batches), rel=1e-5)
