"""Bit packing of quantizer indices and carriers for token ids at pipeline boundaries.

Index packing (``pack_indices`` / ``unpack_indices``): n non-negative integers, each below 2**bits, are
written into one little-endian bit stream of exactly ``ceil(n * bits / 8)`` bytes. Element i occupies
stream bits [i*bits, (i+1)*bits), its least significant bit first; stream bit j is bit (j % 8) of byte
j // 8 (bit 0 = least significant). The last byte is zero-padded. Everything is vectorised torch: an
element's bits are expanded into a (n, bits) 0/1 matrix, flattened, and every run of 8 is summed with
weights 1, 2, ..., 128. Memory is O(n * bits) bytes of temporaries. For 8 bits (a 256-entry codebook, RVQ's
default) that stream is the indices as bytes, so packing and unpacking are one cast each way.

Token-id carriers: ``torch.distributed.pipelining`` requires floating-point stage outputs during
training, so integer ids travel bit-preserved inside a float tensor (a ``view``, never a numeric cast):
ids < 2**31 as int32 viewed as float32, or ids < 2**16 as uint16 bit patterns in int16 / bfloat16. The
carriers are only ever copied (sent, received, cloned); any arithmetic on them destroys the ids (many
ids are subnormal floats, which flush-to-zero modes would erase).
"""

from __future__ import annotations

import math

import torch

MAX_BITS = 32
BYTE = 8  # indices of 8 bits are the stream's bytes themselves: packing is a cast (no bit expansion)
UINT16_LIMIT = 1 << 16


def bits_for(codebook_size: int) -> int:
    """Bits needed for one index into a codebook of ``codebook_size`` entries: ceil(log2 K), K >= 2."""
    if codebook_size < 2:
        raise ValueError(f"codebook_size must be >= 2, got {codebook_size}")
    return (codebook_size - 1).bit_length()


def packed_nbytes(n: int, bits: int) -> int:
    """Bytes that ``pack_indices`` produces for n indices of ``bits`` bits: ceil(n * bits / 8)."""
    _check_bits(bits)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return (n * bits + 7) // 8


def pack_indices(idx: torch.Tensor, bits: int, check: bool = True) -> torch.Tensor:
    """Pack every element of an integer tensor (any shape, e.g. (..., Q)) into ``bits`` bits.

    Returns a flat uint8 tensor of ``packed_nbytes(idx.numel(), bits)`` bytes on idx's device. With
    ``check`` the values are verified to lie in [0, 2**bits) (a host sync on accelerators).
    """
    _check_bits(bits)
    if idx.dtype.is_floating_point or idx.dtype == torch.bool:
        raise TypeError(f"pack_indices needs an integer tensor, got {idx.dtype}")
    flat = idx.reshape(-1).to(torch.int64)  # (n,)
    n = flat.numel()
    if check and n and (int(flat.min()) < 0 or int(flat.max()) >= (1 << bits)):
        raise ValueError(
            f"indices must lie in [0, 2**{bits}); got range [{int(flat.min())}, {int(flat.max())}]"
        )
    if bits == BYTE:  # the stream's byte i is element i itself (RVQ's 256-entry codebooks): one cast
        return flat.to(torch.uint8)
    shifts = torch.arange(bits, device=flat.device, dtype=torch.int64)  # (bits,)
    stream = ((flat.unsqueeze(1) >> shifts) & 1).to(torch.uint8).reshape(-1)  # (n*bits,)
    nbytes = packed_nbytes(n, bits)
    padded = torch.zeros(nbytes * 8, dtype=torch.uint8, device=flat.device)
    padded[: stream.numel()] = stream
    weights = 1 << torch.arange(8, device=flat.device, dtype=torch.int32)  # (8,)
    return (padded.view(nbytes, 8).to(torch.int32) * weights).sum(1).to(torch.uint8)  # (nbytes,)


def unpack_indices(buf: torch.Tensor, bits: int, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
    """Inverse of ``pack_indices``: int64 tensor of ``shape`` from a flat uint8 buffer."""
    _check_bits(bits)
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise TypeError(
            f"unpack_indices needs a flat uint8 buffer, got {buf.dtype} of shape {tuple(buf.shape)}"
        )
    n = math.prod(shape)
    if buf.numel() != packed_nbytes(n, bits):
        raise ValueError(
            f"buffer has {buf.numel()} bytes, {n} indices of {bits} bits need {packed_nbytes(n, bits)}"
        )
    if bits == BYTE:
        return buf.to(torch.int64).reshape(shape)
    byte_shifts = torch.arange(8, device=buf.device, dtype=torch.int32)  # (8,)
    stream = ((buf.to(torch.int32).unsqueeze(1) >> byte_shifts) & 1).reshape(-1)[: n * bits]  # (n*bits,)
    weights = 1 << torch.arange(bits, device=buf.device, dtype=torch.int64)  # (bits,)
    return (stream.view(n, bits).to(torch.int64) * weights).sum(1).reshape(shape)


def ids_to_payload(ids: torch.Tensor, check: bool = True) -> torch.Tensor:
    """Token ids (B, T) in [0, 65536) -> int16 tensor holding their uint16 bit patterns (2 bytes/id).

    int16 rather than torch.uint16 because the latter has almost no operator (or gloo) support.
    """
    ids = ids.to(torch.int64)
    if check and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= UINT16_LIMIT):
        raise ValueError(f"token ids must lie in [0, {UINT16_LIMIT}) for a 2-byte payload")
    return torch.where(ids >= (1 << 15), ids - UINT16_LIMIT, ids).to(torch.int16)


def payload_to_ids(payload: torch.Tensor) -> torch.Tensor:
    """Inverse of ``ids_to_payload``: int16 (or bf16 carrier viewed back) -> int64 ids in [0, 65536)."""
    if payload.dtype == torch.bfloat16:
        payload = payload.view(torch.int16)
    if payload.dtype != torch.int16:
        raise TypeError(f"expected an int16 or bfloat16 payload, got {payload.dtype}")
    return payload.to(torch.int64) & 0xFFFF


def ids_to_bf16(ids: torch.Tensor) -> torch.Tensor:
    """Token ids < 65536 -> bfloat16 tensor with the same bits (a view of the int16 payload)."""
    return ids_to_payload(ids).view(torch.bfloat16)


def bf16_to_ids(carrier: torch.Tensor) -> torch.Tensor:
    """Inverse of ``ids_to_bf16``; bit-exact as long as the carrier was only copied."""
    if carrier.dtype != torch.bfloat16:
        raise TypeError(f"expected a bfloat16 carrier, got {carrier.dtype}")
    return payload_to_ids(carrier)


def ids_to_float32(ids: torch.Tensor, check: bool = True) -> torch.Tensor:
    """Integer ids in [0, 2**31) -> float32 tensor with the int32 bits (4 bytes/id, a ``view``)."""
    ids = ids.to(torch.int64)
    if check and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= (1 << 31)):
        raise ValueError("ids must lie in [0, 2**31) for the float32 carrier")
    return ids.to(torch.int32).view(torch.float32)


def float32_to_ids(carrier: torch.Tensor) -> torch.Tensor:
    """Inverse of ``ids_to_float32``: float32 carrier -> int64 ids, bit-exact."""
    if carrier.dtype != torch.float32:
        raise TypeError(f"expected a float32 carrier, got {carrier.dtype}")
    return carrier.view(torch.int32).to(torch.int64)


def _check_bits(bits: int) -> None:
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits must lie in [1, {MAX_BITS}], got {bits}")
