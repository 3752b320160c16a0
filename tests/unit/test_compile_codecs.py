"""``train.compile`` compiles each boundary half's tensor math (pipeline/boundary.compile_codecs): the encoder's
anchor-and-projection and the decoder's lift run as compiled regions and give the eager halves' outputs and
gradients. The reference is the same pair of halves run eagerly; the backend counts that the regions ran compiled."""

from __future__ import annotations

import torch
from torch import nn

from slimpar.pipeline.boundary import BoundaryDecoder, BoundaryEncoder, compile_codecs
from slimpar.pipeline.spec import CodecSpec, StageContext

D, V, MB, T = 32, 50, 2, 6


def _pair(spec: CodecSpec, embedding: torch.Tensor) -> tuple[nn.ModuleDict, StageContext, StageContext]:
    sctx, rctx = StageContext(), StageContext()
    halves = nn.ModuleDict({"send0": BoundaryEncoder(spec, sctx, embedding),
                            "recv0": BoundaryDecoder(spec, rctx, embedding)})
    return halves, sctx, rctx


def _step(halves: nn.ModuleDict, sctx: StageContext, rctx: StageContext, h: torch.Tensor, ids: torch.Tensor):
    """Encode, send the message by hand, decode, and take a loss's gradient through both halves."""
    sctx.ids, rctx.ids = {0: ids}, {0: ids}
    h = h.clone().requires_grad_(True)
    enc, dec = halves["send0"], halves["recv0"]
    out = enc(h)
    msg = enc.outbox.pop(0)
    act = dec.decode([p.tensor for p in msg.fixed], [p.tensor for p in msg.extra], (MB, T)).requires_grad_(True)
    rebuilt = dec(act)
    rebuilt.square().mean().backward()
    out.backward(act.grad)  # the decoder's input gradient reaches the encoder, as the wire would carry it
    grads = {n: p.grad.clone() for n, p in halves.named_parameters() if p.grad is not None}
    return out.detach(), rebuilt.detach(), h.grad, grads


def test_compiled_boundary_regions_give_the_eager_halves_outputs_and_gradients():
    spec = CodecSpec.mapl(D, 4, vocab=V, seed=1)  # the CLI's MAPL: receiver anchors, local ids
    assert spec.anchors != "none"
    embedding = torch.randn(V, D, generator=torch.Generator().manual_seed(0))
    h = torch.randn(MB, T, D, generator=torch.Generator().manual_seed(2))
    ids = torch.randint(0, V, (MB, T), generator=torch.Generator().manual_seed(3))
    eager = _step(*_pair(spec, embedding), h, ids)

    calls: list[int] = []

    def backend(gm, example_inputs):  # aot_eager's graphs, counted each time they run
        from torch._dynamo.backends.debugging import aot_eager

        compiled = aot_eager(gm, example_inputs)

        def run(*args):
            calls.append(1)
            return compiled(*args)
        return run

    torch._dynamo.reset()
    halves, sctx, rctx = _pair(spec, embedding)
    compile_codecs(halves, backend)
    compiled = _step(halves, sctx, rctx, h, ids)
    assert len(calls) == 2  # the encoder's project and the decoder's lift, each once
    for a, b in zip(eager[:3], compiled[:3], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
    assert eager[3].keys() == compiled[3].keys() == {"send0.projector.A", "recv0.projector.A", "recv0.anchor.E"}
    for name, g in eager[3].items():
        torch.testing.assert_close(compiled[3][name], g, rtol=1e-6, atol=1e-6, msg=name)
