"""The single-process virtual pipeline against independent references.

- ``none`` through 3 stages equals plain single-process training (torch.optim.AdamW, full-batch loss,
  torch's clip_grad_norm_) and plain evaluation;
- ``mapl`` with r = d starting at the identity equals ``none``;
- bytes per step, per boundary, direction and kind equal hand counts from the shapes for every codec;
- both copies of every shared parameter (A, symmetric anchors) stay bit-identical and orthonormal;
- a diverged copy is found by the checksum and resynced, with the bytes counted;
- inside the pipeline, every RVQ decode on the receiver equals the sender's quantized codes;
- the compressed pipeline is causal (future tokens do not change earlier logits), training and eval mode;
- tied embeddings: the same as single-process training of the tied model, stage 0's embedding and the
  last stage's head (and their AdamW states) bitwise identical after every step, the tied weight's
  gradient counted once in the clip norm, one tensor in the export, exact fp32 parts on the wire.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from slimpar.pipeline.evaluate import forward_batch
from slimpar.pipeline.spec import resolve_anchors
from slimpar.train.build import build_data, build_model, build_optimizer, loss_fn, lr_at
from slimpar.train.evaluate import evaluate
from slimpar.train.run_plan import run_plan
from slimpar.train.strategies.base import Strategy
from slimpar.train.strategies.pipeline import VirtualPipelineStrategy
from slimpar.train.validate.checks import load_run_config
from tests.helpers import TINY, VIRTUAL_PIPELINE, batch_fn, single_process_context

BASE = VIRTUAL_PIPELINE
B, T, D = 8, 64, 64
CTX = single_process_context()


@pytest.fixture(scope="module")
def data():
    return build_data(load_run_config(TINY, BASE))


def _cfg(*overrides: str):
    return load_run_config(TINY, [*BASE, *overrides])


_batch_fn = batch_fn


def _set_lr(opt, cfg, step: int, steps: int) -> None:
    scale = lr_at(step, cfg, steps) / cfg.train.lr  # what the trainer does each step
    for g in opt.param_groups:
        g["lr"] = g.setdefault("base_lr", g["lr"]) * scale


def _train_virtual(data, cfg, steps: int):
    strat = VirtualPipelineStrategy(cfg, build_model(cfg, data), CTX, run_plan(cfg, data.vocab_size))
    opt = strat.build_optimizer(cfg)
    losses = []
    for step in range(steps):
        _set_lr(opt, cfg, step, steps)
        opt.zero_grad(set_to_none=True)
        losses.append(float(strat.train_step(step, _batch_fn(data, cfg))))  # a device tensor (one host read a step)
        strat.after_backward()
        strat.clip_grad_norm(cfg.train.grad_clip)
        opt.step()
        strat.after_step()
    return strat, losses


def _train_single(data, cfg, steps: int):
    model = build_model(cfg, data)
    opt = build_optimizer(list(model.named_parameters()), cfg)
    losses = []
    for step in range(steps):
        _set_lr(opt, cfg, step, steps)
        opt.zero_grad(set_to_none=True)
        x, y = _batch_fn(data, cfg)(step, 0)
        loss = loss_fn(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize("tie", ["false", "true"])
def test_virtual_pipeline_without_codec_equals_single_process(data, tie: str) -> None:
    cfg = _cfg("--pipeline.stages", "3", "--pipeline.microbatches", "4", "--model.tie_embeddings", tie)
    model, ref = _train_single(data, cfg, 4)
    strat, got = _train_virtual(data, cfg, 4)
    assert got == pytest.approx(ref, rel=1e-5)
    ref_eval = evaluate(Strategy(model), data, cfg, 0, 1)
    got_eval = strat.evaluate(data, cfg)
    assert set(got_eval) == set(ref_eval)
    for k, v in ref_eval.items():
        assert got_eval[k] == pytest.approx(v, rel=1e-5), k
    full = strat.full_state_dict()
    for k, v in model.state_dict().items():
        assert torch.allclose(full[k], v, atol=1e-5), k
    assert (full["output.weight"] is full["tok_embeddings.weight"]) == (tie == "true")  # as in the model's


def test_mapl_full_rank_identity_start_equals_none(data) -> None:
    _, ref = _train_virtual(data, _cfg("--pipeline.microbatches", "2"), 4)
    # the degenerate codec: r = d from the identity, without the anchors that MAPL carries by default
    strat, got = _train_virtual(data, _cfg("--pipeline.microbatches", "2", "--pipeline.codec", "mapl",
                                           "--pipeline.rank", str(D), "--pipeline.anchors", "none"), 4)
    assert got == pytest.approx(ref, abs=1e-5)
    A_send, A_recv = strat.stages[0].encoder.projector.A, strat.stages[1].decoder.projector.A
    # with r = d the loss does not depend on A (AAᵀ = I): SPEL may rotate A (the exact gradient is normal
    # to the manifold at A = I, the int8-rounded parts are not quite), but the copies agree and stay orthogonal
    assert torch.equal(A_send, A_recv)
    A = A_send.detach().double()
    assert torch.linalg.matrix_norm(A.T @ A - torch.eye(D, dtype=torch.float64)) <= 1e-5


def _expected_bytes(cfg, x: torch.Tensor, stages: int) -> dict:
    """Hand count of one step's bytes per (boundary, direction, kind) for the configs below."""
    pc, n = cfg.pipeline, x.numel()
    r = pc.rank or D // pc.compression if pc.codec in ("mapl", "ssn", "naive") else D
    per_token = {"none": 4 * D, "bf16": 2 * D, "int8": D + 4}.get(pc.codec, 4 * r)
    out = {}
    for b in range(stages - 1):
        out[(b, "fwd", "payload")] = out[(b, "bwd", "payload")] = n * per_token
        anchors = resolve_anchors(pc.codec, pc.anchors)
        if (anchors != "none" or pc.codec == "ssn") and pc.ids == "send":
            out[(b, "fwd", "ids")] = 2 * n
        size = {"int8": 1, "bf16": 2, "fp32": 4}[pc.sync_dtype]
        scale = 4 if pc.sync_dtype == "int8" else 0  # int8 parts carry a float32 scale per row
        sync = D * r * size + D * scale if pc.codec == "mapl" else 0  # A's gradient part (d, r)
        if anchors == "factorized" and pc.anchor_form == "symmetric":
            u = len(torch.unique(x))  # rows of the step's distinct ids
            sync += u * pc.anchor_dim * size + u * scale
        if sync:
            out[(b, "fwd", "sync")] = out[(b, "bwd", "sync")] = sync
    if cfg.model.tie_embeddings:  # link P − 1: stage 0 sends its embedding rows, stage P − 1 the dense head
        out[(stages - 1, "fwd", "tied")] = len(torch.unique(x)) * D * 4
        out[(stages - 1, "bwd", "tied")] = cfg.data.vocab_size * D * 4
    return out


SYMMETRIC = ("--pipeline.anchors", "factorized", "--pipeline.anchor_dim", "8", "--pipeline.anchor_form", "symmetric",
             "--pipeline.ids", "send")
BYTE_CASES = {
    "none": [], "bf16": ["--pipeline.codec", "bf16"], "int8": ["--pipeline.codec", "int8"],
    "mapl": ["--pipeline.codec", "mapl"],  # the defaults: receiver-only anchors, ids read locally
    "mapl_no_anchors": ["--pipeline.codec", "mapl", "--pipeline.anchors", "none"],
    "mapl_receiver_ids_sent": ["--pipeline.codec", "mapl", "--pipeline.ids", "send"],
    "naive": ["--pipeline.codec", "naive", "--pipeline.rank", "8"],
    "ssn": ["--pipeline.codec", "ssn", "--pipeline.compression", "8"],
    "ssn_ids_sent": ["--pipeline.codec", "ssn", "--pipeline.compression", "8", "--pipeline.ids", "send"],
    "mapl_anchors": ["--pipeline.codec", "mapl", *SYMMETRIC],
    "mapl_anchors_sync_fp32": ["--pipeline.codec", "mapl", *SYMMETRIC, "--pipeline.sync_dtype", "fp32"],
    "mapl_sync_bf16": ["--pipeline.codec", "mapl", "--pipeline.sync_dtype", "bf16"],
    "none_tied": ["--model.tie_embeddings", "true"],
    "mapl_anchors_tied": ["--pipeline.codec", "mapl", *SYMMETRIC, "--model.tie_embeddings", "true"],
}


@pytest.mark.parametrize("name", list(BYTE_CASES))
def test_bytes_per_step_equal_hand_counts(data, name: str) -> None:
    # the random start: the PCA start's one-off bytes at step 0 are counted in test_pipeline_projector.py
    # and r = d / K (compression_of payload): the hand count divides the payload; the total meaning's r is
    # the byte model's (test_pipeline_budget.py)
    cfg = _cfg("--pipeline.stages", "3", "--pipeline.microbatches", "2", "--pipeline.projector_init", "random",
               "--pipeline.compression_of", "payload", *BYTE_CASES[name])
    strat, _ = _train_virtual(data, cfg, 2)
    x, _ = _batch_fn(data, cfg)(1, 0)
    expected = _expected_bytes(cfg, x, 3)
    assert dict(strat.counter.step) == expected
    strat.evaluate(data, cfg)  # evaluation traffic is not training traffic
    summary = strat.summary_extras()
    fwd = sum(v for (_, d, _), v in expected.items() if d == "fwd")
    bwd = sum(v for (_, d, _), v in expected.items() if d == "bwd")
    none = 2 * B * T * D * 4  # two boundaries, float32 d per token
    assert summary["comm_bytes_per_step_none"] == none
    if "anchors" not in name and "tied" not in name:  # steady traffic (anchor and tied rows follow the ids)
        assert summary["comm_bytes_per_step_fwd"] == fwd and summary["comm_bytes_per_step_bwd"] == bwd
    assert summary["compression_ratio"] == pytest.approx(2 * none / (summary["comm_bytes_per_step_fwd"]
                                                                      + summary["comm_bytes_per_step_bwd"]))


@pytest.mark.parametrize("update_every, kinds", [
    # one EMA update a step from both microbatches, so the second microbatch's message is a header
    ("1", ["full", "none", "delta", "none", "full", "none", "delta", "none"]),
    ("0", ["full", "delta", "delta", "delta", "full", "delta", "delta", "delta"]),  # an update every microbatch
])
def test_rvq_bytes_and_receiver_decodes_match_the_sender(data, update_every: str, kinds: list[str]) -> None:
    cfg = _cfg("--pipeline.microbatches", "2", "--pipeline.codec", "mapl", "--pipeline.rvq.levels", "2",
               "--pipeline.rvq.codebook", "64", "--pipeline.rvq.sync_every", "2",
               "--pipeline.rvq.update_every", update_every, "--pipeline.compression_of", "payload")  # r = d / 4
    strat = VirtualPipelineStrategy(cfg, build_model(cfg, data), CTX, run_plan(cfg, data.vocab_size))
    opt = strat.build_optimizer(cfg)
    enc, pipe = strat.stages[0].encoder, strat.pipe
    sent, got, headers = [], [], []
    enc.register_forward_hook(lambda mod, args, out: sent.append(out.detach().clone()))
    receive, message = pipe.receive, enc.codebook.message
    pipe.receive = lambda b, shape: got.append(receive(b, shape)) or got[-1]
    dec = strat.stages[1].decoder  # one pass: the step's microbatches decoded together
    decode_parts = dec.decode_parts
    dec.decode_parts = lambda msgs, shape: got.extend(decode_parts(msgs, shape).split(B // 2)) or torch.cat(got[-2:])
    enc.codebook.message = lambda k: headers.append(message(k)) or headers[-1]
    for step in range(4):
        opt.zero_grad()
        strat.train_step(step, _batch_fn(data, cfg))
        opt.step()
    # one pass (update_every 1) quantizes both microbatches in one forward: compare them microbatch by microbatch
    assert strat.pipe.one_pass == (update_every != "0")
    sent = [part for out in sent for part in out.split(B // 2)]
    assert len(sent) == len(got) == 8 and all(torch.equal(a, b) for a, b in zip(sent, got, strict=True))
    assert [h.kind for h in headers] == kinds  # full tables at steps 0 and 2 (sync_every = 2)
    assert len({h.version for h in headers}) == 8 - kinds.count("none")  # a header-only message: no new codebook
    mb_tokens = B // 2 * T
    cb = sum(32 + h.values.shape[0] * (2 if h.kind == "delta" else 0) + h.values.numel() * 4 for h in headers[-2:])
    assert strat.counter.step[(0, "fwd", "payload")] == 2 * math.ceil(mb_tokens * 2 * 6 / 8)  # 6 bits per index
    assert strat.counter.step[(0, "fwd", "codebook")] == cb
    assert strat.counter.step[(0, "bwd", "payload")] == B * T * 16 * 4


@pytest.mark.parametrize("training", [False, True])
def test_compressed_pipeline_stays_causal(data, training: bool) -> None:
    """Changing the tokens from position t0 on leaves the logits before t0 unchanged, through RVQ codes,
    codebooks, PCA-started projectors and anchors (a codec that mixed positions would leak the future)."""
    cfg = _cfg("--pipeline.stages", "3", "--pipeline.codec", "mapl", "--pipeline.compression", "16",
               "--pipeline.projector_init", "pca", "--pipeline.rvq.levels", "2", "--pipeline.rvq.codebook", "16",
               "--pipeline.anchors", "factorized", "--pipeline.anchor_init", "zero")
    strat, _ = _train_virtual(data, cfg, 3)
    x, _ = _batch_fn(data, cfg)(7, 0)
    future = x.clone()
    gen = torch.Generator().manual_seed(0)
    future[:, T // 2:] = torch.randint(0, cfg.data.vocab_size, (B, T - T // 2), generator=gen)
    logits = []
    for inp in (x, future):  # each from the same state: a training forward also updates the codebooks
        pipe = copy.deepcopy(strat.pipe)
        for stage in pipe.stages:
            stage.train(training)
        links_in = {p: receiver for p, (_, receiver) in enumerate(pipe.links)}
        links_out = {p: sender for p, (sender, _) in enumerate(pipe.links)}
        with torch.no_grad():
            logits.append(forward_batch(pipe.stages, links_in, links_out, inp))
    assert torch.equal(logits[0][:, : T // 2], logits[1][:, : T // 2])
    assert not torch.equal(logits[0][:, T // 2:], logits[1][:, T // 2:])


def test_shared_copies_stay_identical_and_orthonormal(data) -> None:
    cfg = _cfg("--pipeline.stages", "3", "--pipeline.microbatches", "2", "--pipeline.codec", "mapl",
               "--pipeline.anchors", "factorized", "--pipeline.anchor_form", "symmetric", "--pipeline.spel_lr", "0.05")
    strat, _ = _train_virtual(data, cfg, 5)
    for p in range(2):
        enc, dec = strat.stages[p].encoder, strat.stages[p + 1].decoder
        assert torch.equal(enc.projector.A, dec.projector.A) and torch.equal(enc.anchor.E, dec.anchor.E)
        A = enc.projector.A.detach().double()
        assert torch.linalg.matrix_norm(A.T @ A - torch.eye(A.shape[1], dtype=torch.float64)) <= 1e-5
    assert 0 < strat.max_orth <= 1e-5


def test_checksum_finds_and_repairs_a_diverged_copy(data) -> None:
    cfg = _cfg("--pipeline.microbatches", "2", "--pipeline.codec", "mapl")
    strat, _ = _train_virtual(data, cfg, 1)
    A_send, A_recv = strat.stages[0].encoder.projector.A, strat.stages[1].decoder.projector.A
    with torch.no_grad():
        A_recv.add_(1e-3)
    strat.counter.begin_step()
    assert strat.pipe.check_shared() == 1 and torch.equal(A_send, A_recv)
    d, r = A_send.shape
    assert dict(strat.counter.step) == {(0, "fwd", "sync"): 8 + d * r * 4, (0, "bwd", "sync"): 8}
    strat.counter.begin_step()
    assert strat.pipe.check_shared() == 0
    assert dict(strat.counter.step) == {(0, "fwd", "sync"): 8, (0, "bwd", "sync"): 8}


def test_tied_embedding_copies_stay_bitwise_identical(data) -> None:
    """Stage 0's embedding and stage 2's head: identical values and AdamW states after every step (int8
    A-sync and anchors alongside), the tied gradient once in the clip norm, checksum and resync."""
    tie = ["--model.tie_embeddings", "true", "--pipeline.microbatches", "2"]
    cfg = _cfg("--pipeline.stages", "3", "--pipeline.codec", "mapl", "--pipeline.anchors", "factorized", *tie)
    strat = VirtualPipelineStrategy(cfg, build_model(cfg, data), CTX, run_plan(cfg, data.vocab_size))
    opt = strat.build_optimizer(cfg)
    emb, head = strat.stages[0].model.tok_embeddings.weight, strat.stages[2].model.output.weight
    assert emb is not head and torch.equal(emb, head)
    for step in range(3):
        _set_lr(opt, cfg, step, 3)
        opt.zero_grad(set_to_none=True)
        strat.train_step(step, _batch_fn(data, cfg))
        assert torch.equal(emb.grad, head.grad)  # the summed gradient, the same bits on both ends
        strat.clip_grad_norm(cfg.train.grad_clip)
        opt.step()
        strat.after_step()
        assert torch.equal(emb, head), step
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[emb][key], opt.state[head][key]), (step, key)
    with torch.no_grad():
        head.add_(1e-3)
    strat.counter.begin_step()
    assert strat.pipe.check_shared() == 1 and torch.equal(emb, head)  # the head adopts stage 0's copy
    V = cfg.data.vocab_size
    assert strat.counter.step[(2, "fwd", "tied")] == 8 + V * D * 4 and strat.counter.step[(2, "bwd", "tied")] == 8


def test_tied_gradient_counts_once_in_the_clip_norm(data) -> None:
    cfg = _cfg("--pipeline.stages", "2", "--pipeline.microbatches", "2", "--model.tie_embeddings", "true")
    model = build_model(cfg, data)
    strat = VirtualPipelineStrategy(cfg, build_model(cfg, data), CTX, run_plan(cfg, data.vocab_size))
    x, y = _batch_fn(data, cfg)(0, 0)
    loss_fn(model(x), y).backward()
    ref = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
    strat.train_step(0, _batch_fn(data, cfg))
    assert strat.clip_grad_norm(float("inf")) == pytest.approx(ref, rel=1e-5)


def test_codec_state_of_another_rank_is_refused_by_name(data) -> None:
    """load_codec_state (evaluation through the codecs) names a tensor whose shape is not the built codec's."""
    from slimpar.pipeline.virtual import load_codec_state

    cfg = _cfg("--pipeline.codec", "mapl")
    strat = VirtualPipelineStrategy(cfg, build_model(cfg, data), CTX, run_plan(cfg, data.vocab_size))
    A = strat.stages[0].encoder.projector.A
    state = {"send0.projector.A": torch.zeros(A.shape[0], A.shape[1] + 1)}
    with pytest.raises(ValueError, match=rf"send0.projector.A: saved \({A.shape[0]}, {A.shape[1] + 1}\), built"):
        load_codec_state(strat.stages, state)
