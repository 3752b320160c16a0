"""Point-to-point under NCCL's rules, on gloo (tests/rendezvous_p2p.py): no tags, and a send that waits for its
matching receive. The rule itself is checked first (a send-then-receive on both ends is a deadlock, a batched
exchange is not); then the shared-parameter exchange of a boundary (pipeline/sync.py, which on 1586a30 had both
ends send, then receive: a deadlock here, a hang under NCCL once the parts outgrow its buffers), a whole 2-stage
pipeline run with every kind of message (MAPL's A, RVQ codebook tails, anchor rows, the tied embedding's
exchange, checksums every step, evaluation) and an SDP run whose evaluation, checkpoint and export send the
full model's parts to their writer point to point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from tests.helpers import ROOT, TINY, losses, spawn_gloo

N = 1 << 16  # elements per message


def _setup(rank: int, init: str, timeout: float = 4.0) -> None:
    import tests.rendezvous_p2p as rendezvous

    rendezvous.TIMEOUT = timeout
    rendezvous.install()
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)


def _send_then_receive(rank: int, init: str, out: str) -> None:
    from tests.rendezvous_p2p import Deadlock

    _setup(rank, init)
    try:
        dist.isend(torch.full((N,), float(rank)), dst=1 - rank, tag=7)
        dist.irecv(torch.empty(N), src=1 - rank, tag=7).wait()
        result = "passed"
    except Deadlock:
        result = "deadlock"
    Path(f"{out}.{rank}").write_text(result)
    # the peer's send was never matched: leave without a barrier


def _batched(rank: int, init: str, out: str) -> None:
    _setup(rank, init)
    got = torch.empty(N)
    ops = [dist.P2POp(dist.isend, torch.full((N,), float(rank)), 1 - rank, tag=3),
           dist.P2POp(dist.irecv, got, 1 - rank, tag=3)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    Path(f"{out}.{rank}").write_text(str(int(got[0])))
    dist.barrier()
    dist.destroy_process_group()


def test_the_rule_calls_send_then_receive_on_both_ends_a_deadlock(tmp_path):
    assert spawn_gloo(_send_then_receive, 2, tmp_path) == ["deadlock", "deadlock"]


def test_the_rule_lets_one_batched_exchange_through(tmp_path):
    assert spawn_gloo(_batched, 2, tmp_path) == ["1", "0"]


def _shared_exchange(rank: int, init: str, out: str) -> None:
    from slimpar.pipeline.sync import SharedParamSync, tied_sync
    from slimpar.pipeline.wire import ByteCounter, P2PLink

    _setup(rank, init, timeout=20.0)
    role = ("sender", "receiver")[rank]
    link = P2PLink(0, ("fwd", "bwd")[rank], ByteCounter(), 1 - rank, dist.group.WORLD)
    a, tied = nn.Parameter(torch.zeros(256, 64)), nn.Parameter(torch.zeros(512, 128))
    a.grad, tied.grad = torch.full_like(a, rank + 1.0), torch.full_like(tied, rank + 1.0)
    ends = [SharedParamSync([("A", a, False)], role, link, "fp32"), tied_sync([("tied", tied, False)], role, link)]
    for e in ends:  # both phases, as run_phases calls them: every end posts, then every end finishes
        e.post()
    for e in ends:
        e.finish()
    for e in ends:
        e.check_post()
    resynced = [e.check_finish() for e in ends]
    Path(f"{out}.{rank}").write_text(f"{float(a.grad[0, 0])} {float(tied.grad[0, 0])} {resynced}")
    dist.barrier()
    dist.destroy_process_group()


def test_shared_parameter_exchange_waits_for_no_one(tmp_path):
    """Both ends of a boundary's A and of a tied embedding exchange gradient parts and checksums."""
    assert spawn_gloo(_shared_exchange, 2, tmp_path) == ["3.0 3.0 [False, False]"] * 2


def _train_under_rules(tmp_path, *args: str, senders: tuple[int, ...] = (0, 1)) -> None:
    """``slimpar train`` whose workers follow the rules (tests/rendezvous_site); ``senders`` matched sends."""
    log = tmp_path / "matched"
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'rendezvous_site'}", "SLIMPAR_TEST_RENDEZVOUS": "1",
           "SLIMPAR_RENDEZVOUS_LOG": str(log)}
    cmd = [sys.executable, "-m", "slimpar", "train", "--config", str(TINY), "--out", str(tmp_path / "run"),
           "--parallel.workers", "2", "--train.steps", "2", "--eval.batches", "1", "--data.ood", "none", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, PYTHONWARNINGS="ignore", **env))
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert len(losses(tmp_path / "run")) == 2
    assert all(int(Path(f"{log}.{r}").read_text()) > 0 for r in senders)


def test_a_pipeline_run_under_nccl_rules(tmp_path):
    """2 stages, MAPL + RVQ codebook tails + anchors + tied embeddings, checksums every step: every message
    matched in posting order without tags, every send waiting for its receive."""
    _train_under_rules(tmp_path, "--parallel.mode", "pipeline", "--pipeline.stages", "2", "--pipeline.codec", "mapl",
                       "--pipeline.rvq.levels", "2", "--pipeline.checksum_every", "1", "--checkpoint.final", "false",
                       "--checkpoint.export", "false")


def test_an_sdp_run_under_nccl_rules(tmp_path):
    """Neuron-level SDP: evaluation gathers the full model to worker 0 point to point, the checkpoint sends its
    slices to their writers, and the export gathers again; every rank posts its sends and receives alike."""
    _train_under_rules(tmp_path, "--parallel.mode", "sdp", "--sdp.level", "neuron", "--sdp.keep", "0.5", senders=(1,))
