"""How MAPL's projector A is started and stepped (issue 10, item 3), in the one-process virtual pipeline.

- ``projector_init = pca``: both ends of every boundary hold bitwise the same A, orthonormal to 1e-5,
  spanning the top-r right singular subspace of that boundary's activations (minus the anchor
  offset), recomputed here with ``torch.linalg.svd``; the calibration's bytes equal a hand count;
- ``spel_schedule``: the η SPEL actually uses at every step of a real ``Trainer`` run against hand
  computations of the three schedules;
- ``clip_projector``: the model's clip norm with and without A's gradient against a hand computation;
- ``anchor_init = zero``: symmetric anchor tables start at zero on both ends;
- ``freeze_projector_after``: A stops changing and its gradient exchange (d·r + 4d bytes per end) stops.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import slimpar.optim.spel as spel
from slimpar.codecs.stiefel import orth_error
from slimpar.config import ConfigError
from slimpar.train.build import build_data, build_model, lr_at
from slimpar.train.job.context import RunContext
from slimpar.train.run_plan import run_plan
from slimpar.train.strategies.pipeline import VirtualPipelineStrategy
from slimpar.train.trainer import Trainer
from slimpar.train.validate.checks import load_run_config
from tests.helpers import ROOT, TINY, VIRTUAL_PIPELINE, batch_fn, single_process_context

BASE = [*VIRTUAL_PIPELINE, "--pipeline.stages", "3", "--pipeline.codec", "mapl", "--pipeline.rank", "16",
        "--pipeline.projector_init", "random"]  # the random start these tests compare against
B, T, D, R = 8, 64, 64, 16
CTX = single_process_context()

# both ends hold the anchor table (the tests below look at both copies; the default form is receiver-only)
SYM_FACTORIZED = ("--pipeline.anchors", "factorized", "--pipeline.anchor_form", "symmetric")
SYM_FULL = ("--pipeline.anchors", "full", "--pipeline.anchor_form", "symmetric")


@pytest.fixture(scope="module")
def data():
    return build_data(load_run_config(TINY, BASE))


def _cfg(*overrides: str):
    return load_run_config(TINY, [*BASE, *overrides])


_batch_fn = batch_fn


def _strategy(data, cfg):
    strat = VirtualPipelineStrategy(cfg, build_model(cfg, data), CTX, run_plan(cfg, data.vocab_size))
    strat.build_optimizer(cfg)
    return strat


def _principal_cosines(U: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Cosines of the principal angles between span(U) and span(A) (both orthonormal columns)."""
    return torch.linalg.svdvals(U.double().t() @ A.double())


def test_pca_start_is_shared_orthonormal_and_spans_the_top_singular_subspace(data) -> None:
    cfg = _cfg("--pipeline.projector_init", "pca", "--pipeline.pca_batches", "2", *SYM_FACTORIZED,
               "--pipeline.anchor_dim", "8")
    strat = _strategy(data, cfg)
    before = [s.encoder.projector.A.clone() for s in strat.stages[:-1]]
    strat.train_step(0, _batch_fn(data, cfg))  # calibration, then step 0's forward and backward (no update)
    with torch.no_grad():
        _check_pca(strat.stages, [_batch_fn(data, cfg)(i, 0)[0] for i in range(2)], before)
    # bytes of step 0: the step's own plus, per boundary, A (d·r fp32, sync) and the codes (r fp32 per token)
    for p in range(2):
        assert strat.counter.step[(p, "fwd", "sync")] - strat.counter.step[(p, "bwd", "sync")] == D * R * 4
    plain = _strategy(data, _cfg(*SYM_FACTORIZED, "--pipeline.anchor_dim", "8"))
    plain.train_step(0, _batch_fn(data, cfg))
    for p in range(2):
        extra = strat.counter.step[(p, "fwd", "payload")] - plain.counter.step[(p, "fwd", "payload")]
        assert extra == 2 * B * T * R * 4


def _check_pca(stages, batches, before) -> None:
    inputs = batches  # stage 0's input; later stages' inputs are rebuilt through the started A
    for p in range(2):
        enc, dec = stages[p].encoder, stages[p + 1].decoder
        A = enc.projector.A
        assert torch.equal(A, dec.projector.A)  # bitwise the same on both ends
        assert not torch.equal(A, before[p])
        assert orth_error(A) < 1e-5
        xs = []
        for x, inp in zip(batches, inputs, strict=True):
            h = stages[p].model(inp)  # (b, T, d): the residual stream that crosses boundary p
            xs.append(h - enc.anchor(x))
        X = torch.cat([x.reshape(-1, D) for x in xs]).double()
        _, S, Vh = torch.linalg.svd(X, full_matrices=False)
        assert S[R - 1] > S[R] * 1.001  # a real gap, so the subspace is well defined
        cos = _principal_cosines(Vh[:R].t(), A)
        assert torch.all(cos > 1 - 1e-6), cos.min()  # principal angles ~0 (< 1.5e-3 rad)
        inputs = [dec.projector.up(x @ A) + dec.anchor(b) for x, b in zip(xs, batches, strict=True)]


def _eta_run(tmp_path: Path, data, *overrides: str) -> list[list[float]]:
    """η passed to spel_step per optimizer step of a real Trainer run (one entry per copy of each A)."""
    cfg = load_run_config(TINY, [*BASE, "--train.steps", "7", "--checkpoint.export", "false",
                                 "--checkpoint.final", "false", "--pipeline.spel_lr", "0.02", *overrides])
    etas: list[float] = []
    original, batched = spel.spel_step, spel.spel_steps  # the virtual pipeline steps its copies as one batch

    def spy(A, grad, buf, lr, *args, **kwargs):
        etas.append(lr)
        return original(A, grad, buf, lr, *args, **kwargs)

    def spy_batch(As, grads, bufs, lr, *args, **kwargs):
        etas.extend([lr] * len(As))
        return batched(As, grads, bufs, lr, *args, **kwargs)

    spel.spel_step, spel.spel_steps = spy, spy_batch
    try:
        Trainer(cfg, RunContext(0, 1, torch.device("cpu"), tmp_path, None)).run()
    finally:
        spel.spel_step, spel.spel_steps = original, batched
    per_step = [etas[i:i + 4] for i in range(0, len(etas), 4)]  # 2 boundaries × 2 copies of A
    return cfg, per_step


@pytest.mark.parametrize("schedule", ["model", "constant", "cosine"])
def test_spel_eta_per_step_follows_its_schedule(tmp_path, data, schedule) -> None:
    cfg, per_step = _eta_run(tmp_path, data, "--pipeline.spel_schedule", schedule)
    steps, lr0, ratio = 7, 0.02, cfg.train.min_lr_ratio
    assert len(per_step) == steps
    for t, used in enumerate(per_step):
        if schedule == "model":
            want = lr0 * lr_at(t, cfg, steps) / cfg.train.lr
        elif schedule == "constant":
            want = lr0
        else:
            want = lr0 * ratio + 0.5 * (lr0 - lr0 * ratio) * (1 + math.cos(math.pi * t / steps))
        assert len(set(used)) == 1 and used[0] == pytest.approx(want, rel=1e-12), (t, used, want)
    if schedule == "model":
        assert per_step[0][0] == pytest.approx(lr0 / cfg.train.warmup_steps)  # the warm-up the option avoids
    lrs = [json.loads(ln)["lr"] for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lrs == [lr_at(t, cfg, steps) for t in range(steps)]  # the model's schedule is untouched


def _grads_after_backward(data, *overrides: str):
    cfg = _cfg(*overrides)
    strat = _strategy(data, cfg)
    strat.train_step(0, _batch_fn(data, cfg))
    A_ids = {id(s.encoder.projector.A) for s in strat.stages[:-1]}
    copies = {id(s.decoder.projector.A) for s in strat.stages[1:]}
    grads = {id(p): p.grad.clone() for p in strat.parameters() if p.grad is not None}
    model_sq = sum(float(g.double().pow(2).sum()) for i, g in grads.items() if i not in A_ids | copies)
    a_sq = sum(float(grads[i].double().pow(2).sum()) for i in A_ids)
    return strat, grads, A_ids | copies, math.sqrt(model_sq), math.sqrt(a_sq)


@pytest.mark.parametrize("mode", ["global", "separate", "none"])
def test_clip_norm_with_and_without_the_projector_gradient(data, mode) -> None:
    strat, grads, a_ids, model_norm, a_norm = _grads_after_backward(data, "--pipeline.clip_projector", mode)
    max_norm = 1e-3  # far below both norms: every gradient gets clipped
    total = strat.clip_grad_norm(max_norm)
    want = math.hypot(model_norm, a_norm) if mode == "global" else model_norm
    assert total == pytest.approx(want, rel=1e-6)  # per-tensor norms are fp32
    for p in strat.parameters():
        if id(p) not in grads:
            continue
        if id(p) not in a_ids or mode == "global":
            coef = max_norm / (want + 1e-6)
        else:
            coef = {"separate": max_norm / (a_norm + 1e-6), "none": 1.0}[mode]
        torch.testing.assert_close(p.grad, grads[id(p)] * coef, rtol=1e-6, atol=0)
    pairs = [(s.encoder.projector.A, strat.stages[i + 1].decoder.projector.A) for i, s in enumerate(strat.stages[:-1])]
    assert all(torch.equal(a.grad, b.grad) for a, b in pairs)  # both ends keep the same gradient


def test_zero_anchor_start_on_both_ends(data) -> None:
    zero = _strategy(data, _cfg(*SYM_FACTORIZED, "--pipeline.anchor_init", "zero"))
    emb = _strategy(data, _cfg(*SYM_FACTORIZED))
    for s in range(2):
        assert torch.count_nonzero(zero.stages[s].encoder.anchor.E) == 0
        assert torch.count_nonzero(zero.stages[s + 1].decoder.anchor.E) == 0
        assert torch.count_nonzero(emb.stages[s].encoder.anchor.E) > 0  # default: the embedding start
    full = _strategy(data, _cfg(*SYM_FULL, "--pipeline.anchor_init", "zero"))
    assert torch.count_nonzero(full.stages[1].decoder.anchor.E) == 0


def test_frozen_projector_stops_moving_and_stops_its_gradient_exchange(data) -> None:
    cfg = _cfg("--pipeline.freeze_projector_after", "2", "--pipeline.checksum_every", "0")
    strat = _strategy(data, cfg)
    opt, fn = strat.optimizer, _batch_fn(data, cfg)
    seen, sync = [], []
    for step in range(4):
        opt.zero_grad(set_to_none=True)
        strat.train_step(step, fn)
        strat.clip_grad_norm(cfg.train.grad_clip)
        opt.step()
        strat.after_step()
        seen.append([s.encoder.projector.A.clone() for s in strat.stages[:-1]])
        sync.append(sum(n for (_, _, c), n in strat.counter.step.items() if c == "sync"))
    assert not torch.equal(seen[0][0], seen[1][0])  # learning during steps 0 and 1
    for step in (2, 3):
        for p in range(2):
            assert torch.equal(seen[step][p], seen[1][p])
            assert torch.equal(seen[step][p], strat.stages[p + 1].decoder.projector.A)
    # before: per boundary, each end sends its int8 part (d·r values + d fp32 row scales); after: nothing
    assert sync[:2] == [2 * 2 * (D * R + 4 * D)] * 2 and sync[2:] == [0, 0]


@pytest.mark.parametrize("overrides, match", [
    (["--pipeline.codec", "ssn", "--pipeline.projector_init", "pca"], "projector_init"),
    (["--pipeline.spel_schedule", "linear"], "spel_schedule"),
    (["--pipeline.clip_projector", "own"], "clip_projector"),
    (["--pipeline.anchor_init", "random"], "anchor_init"),
    (["--pipeline.pca_batches", "0"], "pca_batches"),
    (["--pipeline.freeze_projector_after", "-1"], "freeze_projector_after"),
])
def test_invalid_projector_options_are_rejected(overrides, match) -> None:
    with pytest.raises(ConfigError, match=match):
        _cfg(*overrides)


def test_bench_rows_for_the_projector_ablations_are_valid() -> None:
    from benchmarks.mapl import rows

    named = {r.name: r for r in rows(quick=False, steps=100)}
    for name in ("MAPL 4x + PCA init", "MAPL 4x + own SPEL schedule", "MAPL 4x + separate clip",
                 "MAPL 4x + zero anchors", "MAPL 4x + PCA + frozen after N", "MAPL 4x + all changes"):
        row = named[name]
        assert "{freeze}" not in " ".join(row.overrides)
        cfg = load_run_config(ROOT / row.config, row.overrides)  # validates
        assert cfg.pipeline.codec == "mapl" and cfg.pipeline.compression == 4
    assert named["MAPL 4x + PCA + frozen after N"].overrides[-1] == "10"
    for name, compression, levels, init in (("MAPL 16x (no RVQ)", 16, 0, "random"),
                                            ("MAPL 8x + all changes", 8, 0, "pca"),
                                            ("MAPL 16x + RVQ + all changes", 16, 2, "pca"),
                                            ("MAPL 16x + all changes (no RVQ)", 16, 0, "pca"),
                                            ("MAPL 16x + RVQ + all changes - commitment", 16, 2, "pca")):
        cfg = load_run_config(ROOT / named[name].config, named[name].overrides)
        assert (cfg.pipeline.compression, cfg.pipeline.rvq.levels) == (compression, levels)
        assert cfg.pipeline.projector_init == init and cfg.pipeline.codec == "mapl"


@pytest.mark.parametrize(("args", "expected"), [
    ([], "pca"),  # the default for MAPL with r < d: it won the long-regime benchmark (docs/results/quality)
    (["--pipeline.compression", "1", "--pipeline.compression_of", "payload"], "random"),  # r = d: the identity
    # start keeps a full-rank codec exact (all of none's bytes, the total meaning, leaves r < d: A's exchange counts)
    (["--pipeline.compression", "1"], "pca"),
    (["--pipeline.rank", "64"], "random"),
    (["--pipeline.projector_init", "random"], "random"),
    (["--pipeline.codec", "ssn"], "random"),
])
def test_auto_projector_init_is_pca_for_compressing_mapl(args, expected):
    from slimpar.config import load_config
    from slimpar.train.strategies.pipeline_specs import codec_specs

    cfg = load_config(None, ["--pipeline.codec", "mapl", *args])
    assert cfg.pipeline.projector_init == ("random" if "random" in args else "auto")
    specs = codec_specs(cfg, 64, 512)  # the one place a run's r, and the start that follows from it, is decided
    assert {s.projector_init for s in specs} == {expected}
