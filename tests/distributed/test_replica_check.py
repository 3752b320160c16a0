"""SDP replica checks (issue 11, item 6): the digest has no blind spots, and a swap of two elements of a
large tensor on one holder is caught by ``check_replicas`` on every rank.

The old checksum weighted element j by (j + 1) mod 1,000,003, so element 1,000,002 had weight 0 and
swapping elements i and i + 1,000,003 (equal weights) went unseen; a byte hash sees both.
"""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.distributed as dist

from slimpar.sdp.holders import _print as _fingerprint
from slimpar.sdp.sync import Piece
from tests.helpers import spawn_gloo

BIG = 2_100_000  # elements: more than twice the old checksum's period of 1,000,003
I, J = 12_345, 12_345 + 1_000_003


def _old_fingerprint(pieces: list[Piece]) -> int:  # the replaced checksum, kept here to show its blind spot
    total = 0
    for p in pieces:
        words = p.view(p.param.detach()).contiguous().view(-1).view(torch.int32).to(torch.int64)
        weights = torch.arange(1, words.numel() + 1, dtype=torch.int64) % 1000003
        total = (total * 31 + int((words * weights).sum() % (2**61 - 1))) % (2**61 - 1)
    return total


def _swap(t: torch.Tensor) -> None:
    flat = t.data.view(-1)
    flat[I], flat[J] = flat[J].clone(), flat[I].clone()


def test_digest_sees_a_swap_the_old_checksum_missed():
    param = torch.nn.Parameter(torch.randn(BIG, generator=torch.Generator().manual_seed(0)))
    pieces = [Piece(param, "big")]
    before_new, before_old = _fingerprint(pieces), _old_fingerprint(pieces)
    _swap(param)
    assert _old_fingerprint(pieces) == before_old  # the blind spot this replaces
    assert _fingerprint(pieces) != before_new
    _swap(param)
    assert _fingerprint(pieces) == before_new  # deterministic: equal bytes, equal digest


def test_digest_covers_every_element_and_the_layout():
    t = torch.zeros(4096)
    pieces = [Piece(torch.nn.Parameter(t), "t")]
    base = _fingerprint(pieces)
    for k in (0, 1000, 4095):
        t[k] = 1e-45  # one denormal ulp
        assert _fingerprint(pieces) != base
        t[k] = 0.0
    assert _fingerprint([Piece(torch.nn.Parameter(t.view(64, 64)), "t")]) != base  # same bytes, other shape


def _worker(rank: int, init: str, result: str) -> None:
    from slimpar.models.llama import Llama, LlamaConfig
    from slimpar.sdp import plan_blocks
    from slimpar.sdp.wrapper import SubnetworkDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.manual_seed(0)
    model = Llama(LlamaConfig.named("tiny", vocab_size=BIG // 64 + 1))  # a tied embedding of > 2.1M elements
    sdp = SubnetworkDataParallel(model, plan_blocks(model, 2, 0.5))
    sdp.check_replicas()  # identical copies pass
    comm = weakref.ref(sdp.holders.comm)
    emb = model.tok_embeddings.weight
    assert emb.numel() > BIG
    if rank == 1:
        _swap(emb)
    try:
        sdp.check_replicas()
        outcome = "missed"
    except RuntimeError as e:
        outcome = str(e)
    # both ranks leave together, with no group or tensor of the check alive. Under a loaded CI machine a rank
    # aborted at exit (1 in 15 runs, then rarer) after writing the right outcome: the wrapper's gradient hooks kept
    # its groups alive until interpreter finalization, where destroying a gloo group can abort (sdp/sync.py)
    del sdp, model, emb
    if comm() is not None:
        outcome += " [the check's groups outlived the wrapper]"
    with open(f"{result}.{rank}", "w") as f:
        f.write(outcome)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_check_replicas_catches_a_swap_in_a_large_tensor(tmp_path):
    for outcome in spawn_gloo(_worker, 2, tmp_path):
        assert outcome.endswith("SDP replicas of shared parameters differ across holders [0, 1]"), outcome
