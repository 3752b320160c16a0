"""Each place issue 39 found handing a collective a host tensor, or mixing host and device tensors, on the
stand-in accelerator (tests/standin_device.py: a process group that takes meta tensors only, FakeTensorMode's
CUDA-like device rule). Every test here failed on 1586a30 with "No backend type associated with device type
cpu" (a CPU tensor entered a collective) or "FakeTensor is wrapped to wrong device" (host and device mixed);
docs/gpu.md lists them."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from slimpar.models.llama import Llama, LlamaConfig
from tests.standin_device import DEVICE, standin_accelerator
from tests.standin_run import StandInText, config


def _llama() -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaConfig.tiny(vocab_size=64))


def _grads(module: torch.nn.Module) -> None:
    for p in module.parameters():
        if p.requires_grad:
            p.grad = torch.ones_like(p)


def test_the_stand_in_refuses_host_tensors_as_nccl_does():
    """The proxy itself: a CPU tensor in a collective, a host tensor added into a device one and a CPU scalar
    stacked with device ones (issue 46) raise; a CPU scalar in an elementwise op does not, as on CUDA."""
    with standin_accelerator(0, 2):
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_reduce(torch.zeros(1))
        with pytest.raises(RuntimeError, match="wrong device"):
            torch.zeros((), dtype=torch.float64).add_(torch.ones((), device=DEVICE))
        dist.all_reduce(torch.zeros(1, device=DEVICE))
        with pytest.raises(RuntimeError, match="same device"):  # FakeTensorMode lets a CPU scalar in; CUDA does not
            torch.stack([torch.zeros((), device=DEVICE), torch.zeros(())])
        torch.ones((), device=DEVICE).mul(torch.tensor(2.0))  # CUDA's exemption: a CPU scalar in an elementwise op


def test_guard_agrees_on_the_group_device():
    """train/guard.py:82-83 (every mode, every step): the bad-rank count was a CPU tensor."""
    from slimpar.train.guard import StepGuard

    with standin_accelerator(0, 2):
        assert StepGuard(0, dist.group.WORLD, 1e-3).check(0, 1.0, 1.0)


def test_reduce_loss_on_the_group_device():
    """train/strategies/base.py:103-104: the logged loss's mean was a CPU tensor."""
    from slimpar.train.strategies.base import Strategy

    with standin_accelerator(0, 2):
        s = Strategy(_llama().to(DEVICE), dist.group.WORLD)
        assert s.reduce_loss(2.0) == 0.0  # the stand-in reads float64 sums as 0: the call is what is tested


def test_evaluation_sums_on_the_device():
    """train/evaluate.py:43,58: the validation sums were CPU tensors, all-reduced over the group."""
    from slimpar.train.evaluate import evaluate
    from slimpar.train.strategies.base import Strategy

    cfg = config("ddp")
    with standin_accelerator(0, 2):
        s = Strategy(_llama().to(DEVICE), dist.group.WORLD, cfg)
        assert "val_loss" in evaluate(s, StandInText(64), cfg, 0, 2, dist.group.WORLD)


def _wrapper(regime: str = "forward", level: str = "block"):
    from slimpar import SubnetworkDataParallel
    from slimpar.sdp.planner import plan_blocks, plan_neurons

    model = _llama()
    plan = plan_blocks(model, 2, 0.5) if level == "block" else plan_neurons(model, 2, 0.5, groups=2)
    return SubnetworkDataParallel(model.to(DEVICE), plan, regime=regime, group=dist.group.WORLD)


@pytest.mark.parametrize("regime", ["forward", "backward"])
def test_sdp_clip_norm_stays_on_the_device(regime):
    """sdp/holders.py:114-126 with the parent all-reduce: the norm was summed into a CPU zero (mixed devices)
    and that CPU tensor all-reduced."""
    with standin_accelerator(0, 2):
        sdp = _wrapper(regime)
        _grads(sdp.module)
        assert sdp.clip_grad_norm_(1.0) == 0.0


def test_virtual_sdp_clip_norm_stays_on_the_device():
    """The same clip in one process (virtual SDP, no collective): host and device mixed, a single GPU broke."""
    from slimpar.sdp.planner import plan_blocks
    from slimpar.sdp.virtual import VirtualSDP

    with standin_accelerator(0, 1):
        model = _llama()
        v = VirtualSDP(model, plan_blocks(model, 2, 0.5), device=DEVICE)
        for m in v.modules:
            _grads(m)
        v.clip_grad_norm_(1.0)


def test_replica_check_gathers_device_fingerprints():
    """sdp/holders.py:169-170 (check_replicas): the fingerprints were a CPU tensor, all-gathered."""
    with standin_accelerator(0, 2):
        _wrapper().check_replicas()


def test_gather_full_model_defaults_to_the_module_device():
    """gather_full_model() defaulted to the CPU: a GPU run got its full model on the host."""
    with standin_accelerator(0, 2):
        full = _wrapper().gather_full_model()
        assert {p.device for p in full.parameters()} == {DEVICE}


@pytest.mark.parametrize("rank", [0, 1])
def test_gather_to_one_rank(rank):
    """Evaluation's gather: worker 0 builds the full model, worker 1 only sends (it holds nothing more)."""
    with standin_accelerator(rank, 2):
        full = _wrapper().gather_full_model(dst=0)
        assert (full is not None) == (rank == 0)


def test_neuron_backward_split_indexes_on_the_device():
    """sdp/apply.py: the backward regime cuts a model already on the device; its unit permutation was a host
    index for ``index_select`` (CUDA's takes a device index only)."""
    with standin_accelerator(0, 2):
        sdp = _wrapper("backward", "neuron")
        assert {p.device for p in sdp.module.parameters()} == {DEVICE}


def test_batched_sdp_norm_without_gradients_is_on_the_device():
    """sdp/batched.py (issue 46's audit): with no gradient yet, the norm was a CPU zero (``torch.zeros`` without
    a device, for an empty list of gradients)."""
    from slimpar.sdp.batched import BatchedSDP
    from slimpar.sdp.planner import plan_blocks

    with standin_accelerator(0, 1):
        model = _llama().to(DEVICE)
        assert BatchedSDP(model, plan_blocks(model, 2, 0.5)).clip_grad_norm_(1.0).device == DEVICE


def test_the_guards_finite_check_without_gradients_is_on_the_device():
    """train/guard.py (issue 46's audit): with no gradient, the finite check was a CPU True, copied over."""
    from slimpar.train.guard import grads_finite

    with standin_accelerator(0, 1):
        assert grads_finite([], DEVICE).device == DEVICE
        assert grads_finite([torch.nn.Parameter(torch.zeros(2, device=DEVICE))], DEVICE).device == DEVICE


def test_an_empty_codebook_message_stays_on_its_device():
    """codecs/codebook_sync.py (issue 46's audit): a "none" message's empty rows and values were made on the CPU
    whatever device the message came on."""
    from slimpar.codecs.codebook_sync import HEADER_DTYPE, HEADER_NUMEL, SyncMessage

    header = torch.zeros(HEADER_NUMEL, dtype=HEADER_DTYPE, device="meta")
    msg = SyncMessage.from_tensors([header], 16, 4, header_values=[3, 3, 0, 0])
    assert (msg.kind, msg.rows.device, msg.values.device) == ("none", header.device, header.device)
