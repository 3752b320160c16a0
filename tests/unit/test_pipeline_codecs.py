"""Boundary codecs in isolation: starting points, exact reconstruction, wire sizes, RVQ codebook sync, SSN.

References are independent of the code under test: hand-computed byte counts from the shapes, numpy
for orthonormality, a plain LLaMA for SSN's effective weights, and the sender's own output for every
decode (the receiver must rebuild it bit for bit).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from slimpar.codecs.anchors import FactorizedAnchor, anchor_basis
from slimpar.codecs.projector import NaiveProjector, StiefelProjector
from slimpar.models.llama import Llama, LlamaConfig
from slimpar.pipeline.boundary import BoundaryDecoder, BoundaryEncoder, grad_decode, grad_packets, inject_loss
from slimpar.pipeline.spec import CodecSpec, RVQSpec, StageContext
from slimpar.pipeline.ssn import apply_ssn, effective_state_dict, residual_in_subspace, ssn_tensors

D, V, MB, T = 32, 50, 2, 6
N = MB * T  # tokens per microbatch


def _pair(spec: CodecSpec, embedding: torch.Tensor | None = None, ssn=None):
    """Encoder and decoder of one boundary, each with its own stage context (as on two ranks)."""
    sctx, rctx = StageContext(), StageContext()
    return (BoundaryEncoder(spec, sctx, embedding, ssn), BoundaryDecoder(spec, rctx, embedding, ssn), sctx, rctx)


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, V, (MB, T), generator=torch.Generator().manual_seed(seed))


def _roundtrip(enc, dec, sctx, rctx, h, ids, local_ids: bool):
    sctx.ids, sctx.microbatch = {0: ids}, 0
    rctx.ids, rctx.microbatch = ({0: ids} if local_ids else {}), 0
    out = enc(h)
    msg = enc.outbox.pop(0)
    specs = dec.fixed_spec((MB, T))
    assert [(tuple(p.tensor.shape), p.tensor.dtype) for p in msg.fixed] == [(s.shape, s.dtype) for s in specs]
    act = dec.decode([p.tensor.clone() for p in msg.fixed], [p.tensor.clone() for p in msg.extra], (MB, T))
    return out, act, msg


def test_projectors_start_identical_on_both_ends_and_orthonormal() -> None:
    a = StiefelProjector(D, 8, seed=3, boundary=1, role="sender").A.detach()
    b = StiefelProjector(D, 8, seed=3, boundary=1, role="receiver").A.detach()
    other = StiefelProjector(D, 8, seed=3, boundary=2).A.detach()
    assert torch.equal(a, b) and not torch.equal(a, other)
    An = a.double().numpy()
    assert np.linalg.norm(An.T @ An - np.eye(8)) <= 1e-6
    assert torch.equal(StiefelProjector(D, D, identity=True).A.detach(), torch.eye(D))
    naive = NaiveProjector(D, 8, seed=3, boundary=1)
    assert torch.equal(naive.down_weight.detach(), a) and torch.equal(naive.up_weight.detach(), a.t())
    assert NaiveProjector(D, 8, role="sender").up_weight is None


def test_factorized_anchor_basis_and_start() -> None:
    P = anchor_basis(D, 6, seed=0, boundary=0)  # (m, d)
    Pn = P.double().numpy()
    assert Pn.shape == (6, D) and np.linalg.norm(Pn @ Pn.T - np.eye(6)) <= 1e-6
    emb = torch.randn(V, D)
    anchor = FactorizedAnchor(V, 6, D, seed=0, boundary=0, embedding=emb)
    ids = _ids(0)
    expected = (emb.double().numpy() @ Pn.T @ Pn)[ids.numpy()]  # the part of E[t] in P's row space
    assert np.allclose(anchor(ids).detach().double().numpy(), expected, atol=1e-5)


CASES = {
    # name: (spec overrides, payload bytes per microbatch fwd, ids bytes)
    "none": (dict(kind="none", rank=D), N * D * 4, 0),
    "bf16": (dict(kind="bf16", rank=D), N * D * 2, 0),
    "int8": (dict(kind="int8", rank=D), N * D * 1 + N * 4, 0),
    "mapl": (dict(kind="mapl", rank=8), N * 8 * 4, 0),
    "naive": (dict(kind="naive", rank=8), N * 8 * 4, 0),
    "ssn": (dict(kind="ssn", rank=8), N * 8 * 4, N * 2),
    "mapl_anchor_sym": (dict(kind="mapl", rank=8, anchors="factorized", anchor_dim=4), N * 8 * 4, N * 2),
    "mapl_anchor_recv_local": (dict(kind="mapl", rank=8, anchors="full", anchor_form="receiver",
                                    ids_on_wire=False), N * 8 * 4, 0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_decoder_rebuilds_the_senders_output_exactly(name: str) -> None:
    over, payload, id_bytes = CASES[name]
    spec = CodecSpec(boundary=0, dim=D, vocab=V, seed=1, **over)
    ssn = ssn_tensors(D, 8, V, seed=1, std=0.02) if spec.kind == "ssn" else None
    enc, dec, sctx, rctx = _pair(spec, torch.randn(V, D), ssn)
    h = torch.randn(MB, T, D)
    ids = _ids(1)
    out, act, msg = _roundtrip(enc, dec, sctx, rctx, h, ids, local_ids=not spec.sends_ids)
    assert act.dtype == torch.float32 and torch.equal(act, out.detach())  # bit-exact rebuild
    assert torch.equal(rctx.ids[0], ids)  # ids received (or read locally) on the receiver
    sizes = {c: sum(p.nbytes() for p in msg.fixed if p.category == c) for c in ("payload", "ids")}
    assert sizes == {"payload": payload, "ids": id_bytes}
    if spec.kind in ("mapl", "naive") and spec.anchors == "none":
        A = enc.projector.A if spec.kind == "mapl" else enc.projector.down_weight
        assert torch.allclose(out, h @ A, atol=1e-6)
    if spec.kind == "mapl" and spec.shares_anchor:  # ĥ = A Aᵀ(h − o) + o
        o = enc.anchor(ids)
        A = enc.projector.A
        assert torch.allclose(dec(act), (h - o) @ A @ A.t() + o, atol=1e-5)


def test_gradient_wire_formats() -> None:
    g = torch.randn(MB, T, 8)
    for kind, nbytes, tol in (("mapl", N * 8 * 4, 0.0), ("bf16", N * 8 * 2, 2**-8), ("int8", N * 8 + N * 4, None)):
        spec = CodecSpec(kind, 0, dim=8, rank=8, vocab=V, seed=0)
        packets = grad_packets(spec, g)
        assert sum(p.nbytes() for p in packets) == nbytes
        back = grad_decode(spec, [p.tensor for p in packets])
        if tol is None:  # int8: error at most half a step of the row's scale
            step = g.abs().amax(-1, keepdim=True) / 127
            assert bool(((back - g).abs() <= step / 2 + 1e-7).all())
        else:
            assert torch.allclose(back, g, rtol=tol, atol=0)


def test_rvq_receiver_decodes_the_senders_codes_after_codebook_updates() -> None:
    """Six training forwards (EMA updates after every microbatch, dead codes, full pushes every 2 steps of 2
    microbatches)."""
    q = RVQSpec(levels=2, codebook=16, decay=0.8, commitment=0.25, sync_every=2, update_every=0)
    spec = CodecSpec("mapl", 0, dim=D, rank=8, vocab=V, seed=2, rvq=q, microbatches=2)
    enc, dec, sctx, rctx = _pair(spec)
    kinds, versions = [], []
    for i in range(6):
        h = torch.randn(MB, T, D, generator=torch.Generator().manual_seed(10 + i)) * (1 + i)
        out, act, msg = _roundtrip(enc, dec, sctx, rctx, h, _ids(i), local_ids=True)
        assert torch.equal(act, out.detach())
        header = msg.fixed[1].tensor
        kind, count = ["none", "delta", "full"][int(header[2])], int(header[3])
        kinds.append(kind)
        versions.append(int(header[0]))
        bits = math.ceil(math.log2(16))
        assert msg.fixed[0].nbytes() == math.ceil(N * 2 * bits / 8)
        rows_bytes = count * 2 if kind == "delta" else 0  # uint16 row ids (Q·K <= 65,536)
        assert sum(p.nbytes() for p in msg.fixed[1:] + msg.extra) == 32 + rows_bytes + count * 8 * 4
    assert kinds[0] == "full" and kinds[4] == "full" and "delta" in kinds[1:4]
    assert versions == sorted(versions) and len(set(versions)) > 3  # the codebook really moved
    enc.eval()
    dec.eval()  # evaluation: no codebook message, the receiver's copy decodes
    out, act, msg = _roundtrip(enc, dec, sctx, rctx, torch.randn(MB, T, D), _ids(9), local_ids=True)
    assert torch.equal(act, out) and len(msg.fixed) == 1


def test_inject_loss_adds_the_auxiliary_gradient() -> None:
    x = torch.randn(5, requires_grad=True)
    out = inject_loss(x * 1.0, (x**2).sum())
    assert torch.equal(out.detach(), x.detach())
    out.sum().backward()
    assert torch.allclose(x.grad, 1 + 2 * x.detach())


def test_ssn_model_boundaries_are_lossless_and_export_plain_weights() -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig.tiny(vocab_size=V, dim=D, n_heads=4, n_kv_heads=2, ffn_dim=48, tie_embeddings=False)
    model = Llama(cfg)
    U, F = ssn_tensors(D, 8, V, seed=0, std=0.02)
    apply_ssn(model, U, F)
    ids = _ids(3)
    h = model.tok_embeddings(ids)
    cos, sin = model.rope_cos[:T], model.rope_sin[:T]
    for name in ("0", "1"):  # constrained blocks: h − F[t] stays in span(U)
        h = model.layers[name](h, cos, sin)
        assert residual_in_subspace(h, ids, U, F) <= 1e-6
    spec = CodecSpec("ssn", 0, dim=D, rank=8, vocab=V, seed=0)
    enc, dec, sctx, rctx = _pair(spec, ssn=(U, F))
    out, act, _ = _roundtrip(enc, dec, sctx, rctx, h.detach(), ids, local_ids=False)
    assert out.shape == (MB, T, 8) and torch.allclose(dec(act), h, atol=1e-6)  # ĥ = h
    plain = Llama(cfg)
    plain.load_state_dict(effective_state_dict(model))
    assert torch.allclose(plain(ids), model(ids), atol=1e-5)
