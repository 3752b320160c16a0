"""Bit packing and token-id carriers, checked against a pure-Python bit-stream reference."""

import math

import pytest
import torch

from slimpar.codecs.packing import (
    bf16_to_ids,
    bits_for,
    float32_to_ids,
    ids_to_bf16,
    ids_to_float32,
    ids_to_payload,
    pack_indices,
    packed_nbytes,
    payload_to_ids,
    unpack_indices,
)


def reference_pack(values: list[int], bits: int) -> bytes:
    """Little-endian bit stream built one bit at a time (independent of the vectorised code)."""
    out = bytearray((len(values) * bits + 7) // 8)
    for i, v in enumerate(values):
        for b in range(bits):
            pos = i * bits + b
            out[pos // 8] |= ((v >> b) & 1) << (pos % 8)
    return bytes(out)


def test_bits_for():
    assert [bits_for(k) for k in (2, 3, 4, 5, 256, 257, 1024, 65536)] == [1, 2, 2, 3, 8, 9, 10, 16]
    with pytest.raises(ValueError):
        bits_for(1)


@pytest.mark.parametrize("bits", range(1, 17))
@pytest.mark.parametrize("n", [1, 7, 13])
def test_pack_round_trip_and_reference(bits: int, n: int):
    g = torch.Generator().manual_seed(bits * 100 + n)
    idx = torch.randint(0, 1 << bits, (n,), generator=g)
    idx[0] = (1 << bits) - 1  # the all-ones pattern must survive
    buf = pack_indices(idx, bits)
    assert buf.dtype == torch.uint8 and buf.numel() == math.ceil(n * bits / 8) == packed_nbytes(n, bits)
    assert bytes(buf.tolist()) == reference_pack(idx.tolist(), bits)
    assert torch.equal(unpack_indices(buf, bits, (n,)), idx)


def test_pack_multidim_shape():
    idx = torch.randint(0, 1024, (3, 5, 4), generator=torch.Generator().manual_seed(0))  # (B, T, Q)
    buf = pack_indices(idx, 10)
    assert buf.numel() == math.ceil(60 * 10 / 8) == 75
    assert torch.equal(unpack_indices(buf, 10, idx.shape), idx)


def test_pack_hand_example():
    # 3-bit values 5 (101), 3 (011), 7 (111): stream LSB-first 1,0,1, 1,1,0, 1,1,1 -> bytes 0b11011101, 0b1
    buf = pack_indices(torch.tensor([5, 3, 7]), 3)
    assert buf.tolist() == [0b11011101, 0b00000001]


def test_pack_rejects_out_of_range_and_bad_sizes():
    with pytest.raises(ValueError):
        pack_indices(torch.tensor([4]), 2)
    with pytest.raises(ValueError):
        pack_indices(torch.tensor([-1]), 4)
    with pytest.raises(ValueError):
        unpack_indices(torch.zeros(3, dtype=torch.uint8), 4, (7,))


def test_ids_uint16_payload_round_trip():
    ids = torch.tensor([[0, 1, 127, 128, 32767], [32768, 40000, 65279, 65408, 65535]])  # (B, T)
    payload = ids_to_payload(ids)
    assert payload.dtype == torch.int16 and payload.element_size() * payload.numel() == 2 * ids.numel()
    assert torch.equal(payload_to_ids(payload), ids)
    carrier = ids_to_bf16(ids)
    assert carrier.dtype == torch.bfloat16
    assert torch.equal(bf16_to_ids(carrier.clone()), ids)  # includes NaN/inf/subnormal bit patterns
    with pytest.raises(ValueError):
        ids_to_payload(torch.tensor([65536]))


def test_ids_float32_carrier_round_trip():
    ids = torch.tensor([[0, 1, 2, 65535, 65536], [2**23, 2**24 + 1, 2**30, 2**31 - 1, 12345]])
    carrier = ids_to_float32(ids)
    assert carrier.dtype == torch.float32 and carrier.shape == ids.shape
    assert torch.equal(float32_to_ids(carrier.clone()), ids)
    with pytest.raises(ValueError):
        ids_to_float32(torch.tensor([2**31]))


def test_eight_bit_indices_pack_with_one_cast_each_way():
    """RVQ's default 256-entry codebooks give 8-bit indices, the stream's bytes themselves: packing them is one cast
    (and a flattening view), not the bit expansion of other widths, with the same bytes as the reference."""
    from slimpar.parallel.syncs import SyncCounter

    idx = torch.randint(0, 256, (4, 16, 2), generator=torch.Generator().manual_seed(3))
    with SyncCounter() as packing:
        buf = pack_indices(idx, 8, check=False)
    with SyncCounter() as unpacking:
        back = unpack_indices(buf, 8, idx.shape)
    assert bytes(buf.tolist()) == reference_pack(idx.reshape(-1).tolist(), 8)
    assert torch.equal(back, idx)
    assert packing.count.ops <= 2 and unpacking.count.ops <= 2, (packing.count.ops, unpacking.count.ops)
