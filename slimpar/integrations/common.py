"""What every integration shares: the SDP options a user passes, the plan and cut from them, and the
holder sync of a model that a user's own ``parallelize`` cut and parallelized.

``wrap_model`` is the whole of SDP for a framework that owns the training loop: it plans (a pure function of
the options, the world size and the model's structure, so every rank computes the same mask without
communicating), cuts this rank's subnetwork out of the full model in place and returns the
:class:`~slimpar.sdp.wrapper.SubnetworkDataParallel` around it. Communication: one process group per distinct
holder set, created collectively at construction; afterwards exactly the wrapper's (holder-set all-reduces
during backward, finished by ``sync()``; one scalar all-reduce for the clip norm; broadcasts for the backward
regime's refresh and for ``gather_full_model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from slimpar.sdp.apply import Subnet
from slimpar.sdp.comm import GroupComm, LocalComm
from slimpar.sdp.holders import HolderSync, holder_sets, refresh_sets
from slimpar.sdp.plan import Plan
from slimpar.sdp.planner import plan_model
from slimpar.sdp.wrapper import SubnetworkDataParallel


@dataclass
class SDPArguments:
    """SDP's options, the same for every stack (``slimpar train``'s ``[sdp]`` names them alike)."""

    keep: float = 0.5  # fraction C of the maskable components (blocks, or MLP unit groups) each worker holds
    level: str = "block"  # block (B-SDP) | neuron (N-SDP: SwiGLU hidden-unit groups)
    regime: str = "forward"  # forward (run the subnetwork) | backward (full forward, masked gradients)
    blocks: str | None = None  # dotted path of the repeated blocks; None: `layers`, or a HF causal LM's model.layers
    groups: int = 4  # neuron level: hidden-unit groups per block
    assignment: str = "cyclic"  # cyclic | random
    seed: int = 0  # seeds the random assignment (a plan is a pure function of seed, world size and model)
    refresh_every: int = 1  # backward regime: refresh the non-held copies from a holder every T steps
    bucket_mb: float = 25.0  # gradient bucket size of the holder-set all-reduces
    check_every: int = 0  # compare the holders' copies (fingerprints) every K optimizer steps; 0 = never


def plan_for(model: nn.Module, world_size: int, sdp: SDPArguments) -> Plan:
    """The plan of ``model`` for ``world_size`` workers; the same on every rank (no communication)."""
    return plan_model(model, world_size, sdp.keep, level=sdp.level, groups=sdp.groups, assignment=sdp.assignment,
                      seed=sdp.seed, blocks=sdp.blocks)


def default_group() -> dist.ProcessGroup | None:
    return dist.group.WORLD if dist.is_initialized() else None


def wrap_model(model: nn.Module, sdp: SDPArguments, group: dist.ProcessGroup | None = None) -> SubnetworkDataParallel:
    """Plan ``model`` for the ranks of ``group`` (default: the world), cut this rank's subnetwork in place and
    wrap it (collective: every rank of the group calls, with the same full model on each).

    Put the model on its device first (the backward regime keeps views of its tensors). The result passes
    through ``accelerate.Accelerator.prepare`` as it is, since Accelerate would otherwise wrap it in DDP, which
    fails because the ranks hold different parameters; so Accelerate neither moves it nor adds autocast
    (use ``torch.autocast`` for mixed precision). Its forward refuses to start a training step while the
    previous step's holder averaging is still in flight, which is what a loop that never calls ``sync()`` does.
    """
    group = group if group is not None else default_group()
    world = dist.get_world_size(group) if group is not None else 1
    wrapped = SubnetworkDataParallel(model, plan_for(model, world, sdp), regime=sdp.regime, group=group,
                                     bucket_mb=sdp.bucket_mb, refresh_every=sdp.refresh_every)
    wrapped._is_accelerate_prepared = True  # Accelerate's guard against wrapping a module twice
    wrapped.register_forward_pre_hook(_require_synced)
    return wrapped


def _require_synced(module: SubnetworkDataParallel, _args) -> None:
    """A forward with gradients while buckets of the last backward are still being all-reduced means the loop
    skipped ``sync()``: the optimizer stepped on half-averaged gradients and the replicas have diverged."""
    gs = module.grad_sync
    if torch.is_grad_enabled() and module.training and gs is not None and any(b.work is not None for b in gs.buckets):
        raise RuntimeError("SDP: sync() was not called after the last backward (holder averaging is still in "
                           "flight). Call model.sync() before clipping and the optimizer step; with "
                           "transformers.Trainer use slimpar.integrations.hf.SDPTrainer, with Lightning "
                           "slimpar.integrations.lightning.SDPStrategy")


def holder_sync(model: nn.Module, plan: Plan, subnet: Subnet, group: dist.ProcessGroup | None = None,
                fsdp: int = 1, bucket_mb: float = 25.0, refresh_every: int = 1,
                timeout: timedelta | None = None) -> HolderSync:
    """SDP's communication for a model that the caller cut with ``apply_subnet(model, plan, worker)`` and then
    parallelized itself (activation checkpointing, ``torch.compile``, FSDP2 over each worker's ``fsdp`` ranks):
    built last, it binds to the parameters as they are then. Collective over ``group`` (default: the world):
    it creates one process group per distinct holder set. Worker w is group ranks w·fsdp .. w·fsdp + fsdp − 1.
    """
    group = group if group is not None else default_group()
    refresh = refresh_sets(plan) if subnet.regime == "backward" else {}  # once: for the groups and the sync
    if group is None:
        comm = LocalComm(1)
    else:
        comm = GroupComm(holder_sets(plan, subnet.regime, refresh), plan.world_size, group, fsdp, timeout)
    worker = comm.workers[0]
    return HolderSync({worker: (model, subnet)}, plan, comm, subnet.regime, bucket_mb, overlap=fsdp == 1,
                      refresh_every=refresh_every, refresh=refresh)
