"""Streaming codebook sync: a receiver fed every message decodes the sender's indices bit-exactly."""

import pytest
import torch

from slimpar.codecs.codebook_sync import (
    CodebookReceiver,
    CodebookSender,
    CodebookVersionError,
    SyncMessage,
)
from slimpar.codecs.rvq import ResidualVQ

DIM, LEVELS, K = 6, 3, 32


def drifting_batch(step: int) -> torch.Tensor:
    """(B, T, DIM) data whose mean drifts with the step, so the codebook keeps changing."""
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(2, 8, DIM, generator=g) + 0.3 * step


def layout_bytes(msg: SyncMessage) -> int:
    """Hand-computed wire size: 4 int64 header, int16 row ids (Q*K = 96 <= 65536) for deltas, fp32 values."""
    n = msg.rows.numel()
    return 4 * 8 + (2 * n if msg.kind == "delta" else 0) + 4 * n * DIM


def run(steps: int, full_every: int, skip: int | None = None, update_every: int = 1):
    rvq = ResidualVQ(DIM, LEVELS, K, decay=0.8, dead_threshold=0.2, seed=3, update_every=update_every).train()
    sender, receiver = CodebookSender(rvq, full_every), CodebookReceiver(DIM, LEVELS, K)
    previous = torch.zeros(LEVELS * K, DIM)
    for step in range(steps):
        quantized, idx, _ = rvq(drifting_batch(step))
        msg = sender.message(step)
        table = rvq.codebooks.reshape(-1, DIM)
        differs = (table != previous).any(1).nonzero().squeeze(1)
        yield step, rvq, msg, receiver, quantized, idx, differs
        previous = table.clone()
        if step != skip:
            receiver.apply(msg)
            assert torch.equal(receiver.decode(idx, rvq.version), quantized)


def test_receiver_tracks_sender_exactly():
    kinds, total = [], 0
    for _, rvq, msg, _, _, _, differs in run(steps=12, full_every=5):
        kinds.append(msg.kind)
        total += msg.nbytes()
        assert msg.version == rvq.version
        assert (
            msg.nbytes() == layout_bytes(msg) == sum(t.numel() * t.element_size() for t in msg.to_tensors())
        )
        if msg.kind == "delta":
            assert msg.rows.tolist() == differs.tolist()  # exactly the rows whose values moved
            mask = rvq.changed_mask.reshape(-1)
            assert mask[msg.rows].all() and 0 < msg.rows.numel() < LEVELS * K
            assert torch.equal(msg.values, rvq.codebooks.reshape(-1, DIM)[msg.rows])
    assert [kinds[s] for s in (0, 5, 10)] == ["full"] * 3
    assert set(kinds[1:5] + kinds[6:10]) == {"delta"}
    assert total > 0


def test_windowed_updates_send_headers_between_deltas():
    """update_every = 3: the codebook changes at forwards 0 (k-means), 3, 6, 9; the messages between are
    header-only and the receiver still decodes every forward bit for bit (``run`` asserts it)."""
    kinds = [msg.kind for _, _, msg, *_ in run(steps=10, full_every=0, update_every=3)]
    assert kinds == ["full", "none", "none", "delta", "none", "none", "delta", "none", "none", "delta"]


def test_no_change_sends_header_only():
    rvq = ResidualVQ(DIM, LEVELS, K, seed=0).train()
    sender, receiver = CodebookSender(rvq, full_every=0), CodebookReceiver(DIM, LEVELS, K)
    _, idx, _ = rvq(drifting_batch(0))
    receiver.apply(sender.message(0))
    rvq.eval()
    q, idx, _ = rvq(drifting_batch(1))  # eval: no codebook change
    msg = sender.message(1)
    assert msg.kind == "none" and msg.nbytes() == 32 and len(msg.to_tensors()) == 1
    receiver.apply(msg)
    assert torch.equal(receiver.decode(idx, rvq.version), q)


def test_skipped_message_raises_until_full_table():
    with pytest.raises(CodebookVersionError, match="lost"):
        for _ in run(steps=6, full_every=0, skip=2):
            pass
    # with periodic full tables the receiver refuses deltas after a loss and recovers at the next full one
    rvq = ResidualVQ(DIM, LEVELS, K, decay=0.8, dead_threshold=0.2, seed=3).train()
    sender, receiver = CodebookSender(rvq, full_every=4), CodebookReceiver(DIM, LEVELS, K)
    for step in range(8):
        quantized, idx, _ = rvq(drifting_batch(step))
        msg = sender.message(step)
        if step == 2:
            continue  # lost
        if step == 3:
            with pytest.raises(CodebookVersionError):
                receiver.apply(msg)
            with pytest.raises(CodebookVersionError):
                receiver.decode(idx, rvq.version)
            continue
        receiver.apply(msg)
        assert msg.kind == ("full" if step in (0, 4) else "delta")
        assert torch.equal(receiver.decode(idx, rvq.version), quantized)


def test_message_tensors_round_trip():
    for _, _, msg, *_ in run(steps=4, full_every=3):
        tensors = msg.to_tensors()
        header = tensors[0]
        specs = SyncMessage.payload_specs(header, LEVELS * K, DIM)
        assert [(tuple(t.shape), t.dtype) for t in tensors[1:]] == specs
        back = SyncMessage.from_tensors(tensors, LEVELS * K, DIM)
        assert (back.version, back.base_version, back.kind) == (msg.version, msg.base_version, msg.kind)
        assert torch.equal(back.rows, msg.rows) and torch.equal(back.values, msg.values)


def test_large_table_uses_int32_row_ids():
    rows = torch.tensor([0, 40000, 69999])
    msg = SyncMessage(5, 4, "delta", rows, torch.zeros(3, 2), num_rows=70000)
    assert msg.nbytes() == 32 + 3 * 4 + 3 * 2 * 4
    assert msg.to_tensors()[1].dtype == torch.int32
    small = SyncMessage(5, 4, "delta", torch.tensor([65535]), torch.zeros(1, 2), num_rows=65536)
    assert small.nbytes() == 32 + 2 + 8
    assert SyncMessage.from_tensors(small.to_tensors(), 65536, 2).rows.tolist() == [65535]
