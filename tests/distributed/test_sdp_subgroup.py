"""SDP inside a sub-group of the world (issue 19, item 2): ``SubnetworkDataParallel(model, plan, group=g)``.

Four gloo processes. Ranks 1, 2, 3 form the group g and run SDP over it with 3 workers and holder sets of
size 1, 2 and 3 (so the holder groups are proper sub-groups of g, named by g's own ranks 0..2, which are
global ranks 1..3); rank 0 runs its own one-worker SDP in a group of its own at the same time, as a rank
outside g does in the SDP × pipeline hybrid. The reference is independent of process groups:
``VirtualSDP`` runs the same 3 workers in one process with the collectives' arithmetic, which is
bit-identical to gloo on CPU. After 3 AdamW steps with clipping, every worker of g must equal its virtual
twin bit for bit (forward and backward regime), the replica check must pass, and the gathered full model
must equal the virtual one's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from slimpar.models.llama import Llama, LlamaConfig
from slimpar.sdp.components import model_components
from slimpar.sdp.plan import plan_components

MASK = np.array([[1, 1, 0, 1], [0, 0, 1, 1], [0, 1, 1, 1]], dtype=np.uint8)  # holders {0}, {0,2}, {1,2}, all
STEPS, GROUP = 3, [1, 2, 3]


def _model() -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaConfig.tiny(vocab_size=64))


def _plan(model, workers: int):
    comps, shared, shared_bytes = model_components(model, "block", 1)
    mask = MASK if workers == 3 else np.ones((1, len(comps)), dtype=np.uint8)
    return plan_components(comps, shared_bytes, workers, mask=mask, assignment="explicit", shared_params=shared)


def _batch(step: int, worker: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + worker)
    x = torch.randint(0, 64, (2, 16), generator=g)
    return x, torch.roll(x, -1, 1)


def _train(modules, sync, opts) -> None:
    for step in range(STEPS):
        for w, m in modules.items():
            x, y = _batch(step, w)
            torch.nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten()).backward()
        sync.sync()
        sync.clip_grad_norm_(0.5)
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        sync.refresh()


def _worker(rank: int, init: str, out: str, regime: str) -> None:
    from slimpar.sdp.wrapper import SubnetworkDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=4)
    groups = [dist.new_group([0]), dist.new_group(GROUP)]  # every rank creates both, in the same order
    mine = groups[1] if rank in GROUP else groups[0]
    model = _model()
    sdp = SubnetworkDataParallel(model, _plan(model, 3 if rank in GROUP else 1), regime=regime, group=mine)
    opt = torch.optim.AdamW([p for p in sdp.parameters() if p.requires_grad], lr=1e-2)
    _train({sdp.rank: sdp}, sdp, [opt])
    sdp.check_replicas()
    full = sdp.gather_full_model()
    if rank in GROUP:
        torch.save({"worker": {n: t.detach().clone() for n, t in model.state_dict().items()},
                    "full": {n: t.detach().clone() for n, t in full.state_dict().items()}}, f"{out}.{rank}")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("regime", ["forward", pytest.param("backward", marks=pytest.mark.slow)])
def test_sdp_in_a_subgroup_equals_virtual_sdp(tmp_path, regime: str) -> None:
    from slimpar.sdp.virtual import VirtualSDP

    torch.set_num_threads(1)
    mp.start_processes(_worker, args=(f"file://{tmp_path / 'store'}", str(tmp_path / "out"), regime), nprocs=4,
                       start_method="spawn")
    model = _model()
    virtual = VirtualSDP(model, _plan(model, 3), regime=regime)
    opts = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2) for m in virtual.modules]
    _train(dict(enumerate(virtual.modules)), virtual, opts)
    virtual.check_replicas()
    full = virtual.gather_full_model().state_dict()
    for w, rank in enumerate(GROUP):
        got = torch.load(f"{tmp_path / 'out'}.{rank}", weights_only=True)
        want = virtual.modules[w].state_dict()
        assert set(got["worker"]) == set(want)
        for name, t in want.items():
            assert torch.equal(got["worker"][name], t), (rank, name)
        for name, t in full.items():
            assert torch.equal(got["full"][name], t), (rank, name)
