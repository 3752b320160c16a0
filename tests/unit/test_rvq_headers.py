"""RVQ's receiver reads one codebook header a step, at the step's first microbatch (the sender changes its
codebook only there), and asserts the others are 'none' on the device; a change where the schedule has none
fails instead of decoding with a stale codebook."""

import pytest
import torch

from slimpar.parallel.syncs import SyncCounter
from slimpar.pipeline.boundary import BoundaryDecoder, BoundaryEncoder
from slimpar.pipeline.spec import CodecSpec, RVQSpec, StageContext

D, V, MB, T, M = 32, 64, 2, 8, 4


def _pair(update_every: int):
    q = RVQSpec(levels=2, codebook=16, decay=0.8, commitment=0.25, sync_every=3, update_every=update_every)
    spec = CodecSpec("mapl", 0, dim=D, rank=8, vocab=V, seed=2, rvq=q, microbatches=M)
    return BoundaryEncoder(spec, StageContext()), BoundaryDecoder(spec, StageContext())


def _step(enc, dec, step: int, mutate=None) -> int:
    """One step of M microbatches through the pair; returns the host reads the receiver made."""
    reads = 0
    for m in range(M):
        enc.context.microbatch = dec.context.microbatch = m
        ids = torch.randint(0, V, (MB, T), generator=torch.Generator().manual_seed(100 * step + m))
        enc.context.ids, dec.context.ids = {m: ids}, {m: ids}
        out = enc(torch.randn(MB, T, D, generator=torch.Generator().manual_seed(10 * step + m)))
        msg = enc.outbox.pop(m)
        fixed = [p.tensor.clone() for p in msg.fixed]
        if mutate is not None:
            mutate(m, fixed)
        with SyncCounter() as c:
            specs = dec.extra_spec(fixed)  # what a transport posts receives for: the announced codebook rows
            extra = [p.tensor.clone() for p in msg.extra]
            assert [(s.shape, s.dtype) for s in specs] == [(tuple(e.shape), e.dtype) for e in extra]
            act = dec.decode(fixed, extra, (MB, T))
        reads += sum(n for site, n in c.count.syncs.items() if "boundary.py" in site)
        assert torch.equal(act, out.detach())  # the receiver decodes the sender's codes bit for bit
    return reads


def test_one_header_read_a_step_and_codes_decode_exactly():
    enc, dec = _pair(update_every=1)
    assert [_step(enc, dec, s) for s in range(5)] == [1] * 5


def test_every_header_is_read_when_the_codebook_changes_every_microbatch():
    enc, dec = _pair(update_every=0)
    assert _step(enc, dec, 0) == M


def test_an_unexpected_codebook_change_fails_on_the_device():
    enc, dec = _pair(update_every=1)
    _step(enc, dec, 0)

    def forge(m, fixed):  # a header that says the codebook moved at a microbatch that is not the step's first
        if m == 2:
            fixed[1][0] += 1

    with pytest.raises(RuntimeError, match="not 'none' at the version held"):
        _step(enc, dec, 1, forge)
