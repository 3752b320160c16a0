"""Reshardable SDP checkpoints: one copy of every tensor, under the full model's own names.

The checkpoint of an SDP run without FSDP has the format of a single-process (or DDP) checkpoint
(:mod:`slimpar.train.checkpoint.dcp`): ``model.<name>`` holds each full-model parameter and persistent
buffer in its full shape, and ``optim.state.<name>.{exp_avg,exp_avg_sq,step}`` /
``optim.param_groups.<name>.<key>`` hold AdamW's state flattened by parameter name
(``StateDictOptions(flatten_optimizer_state_dict=True)``). So SDP with any worker count, keep, level,
regime or plan, and single, DDP and FSDP2 runs, can resume from it, and an SDP run can resume from theirs.

Who writes what: holders of a component have bitwise identical parameters and optimizer state (they
average gradients over their holders every step and run the same AdamW), so one copy is exact. The
**first holder** of a component writes it (the shared parameters and anything outside the plan's
components: worker 0). Whole tensors (blocks, shared parameters) go straight from that rank into DCP;
each rank's state dict holds only the entries it writes, so nothing is stored twice. Neuron-level
tensors are slices of full tensors (``Subnet.index_map``: which global rows/columns a local tensor
holds, in the backward regime split into ``<name>_held`` / ``<name>_frozen``): they are assembled on
the first holder of the layer's first group, each group's slice sent to it point to point by the
group's own first holder (model, ``exp_avg`` and ``exp_avg_sq``; in plan order on every rank).
Non-first holders' BatchNorm running statistics are not saved: evaluation and export use the first
holder's, and training reads batch statistics, so a resume stays exact. In the backward regime with
``refresh_every > 1`` a non-holder's stale copy is replaced by its holder's on resume.

Memory: saving holds, on the writing rank, the full neuron-level tensors it writes (parameters and
two moments) until DCP has written them; other ranks one slice at a time. Loading reads the full
tensor of every name a rank holds (and its two moments) and keeps the rank's slice, so a rank briefly
holds up to 3x the full model's parameters, fine at this project's sizes (llama_small: ~0.2 GB).

Virtual SDP (``sdp.virtual``, :class:`VirtualSDPFullState`) writes the same checkpoint from one process:
what the N ranks would write together, each simulated worker taking its parts; on load every worker takes
its own slices (copies: workers in one process must not share an optimizer moment). So a virtual run
resumes as real SDP and back, bit for bit on CPU (tests/distributed/test_sdp_virtual_resume.py).

SDP with FSDP2 (``sdp.fsdp > 1`` or ``sdp.holder_shard``) keeps the DTensor format tied to its
layout (a resume must use the same SDP config; :func:`slimpar.train.checkpoint.layout.check_layout`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from slimpar.parallel.device import recv, send
from slimpar.train.checkpoint.safe_dcp import dcp_load
from slimpar.train.checkpoint.sdp_pieces import (
    _piece,
    _put,
    _request,
    _sliced,
    _slices,
    _taken,
    _unprefix,
    _whole_entries,
    _writers,
)


class SDPFullState:
    """What the trainer hands to ``save_checkpoint`` / ``load_checkpoint`` for an SDP run without FSDP."""

    def __init__(self, wrapper, options):
        self.wrapper, self.options = wrapper, options
        self.inner = wrapper.module  # the subnetwork, under the full model's parameter names
        skeleton = wrapper.skeleton[0]
        self.shapes = {n: tuple(t.shape) for n, t in skeleton.state_dict(keep_vars=True).items()}
        self.sliced, self.writer = _sliced(wrapper.plan), _writers(wrapper.plan, self.shapes)

    # ------------------------------------------------------------------- save
    def state_to_save(self, optimizer) -> tuple[dict, dict]:
        """This rank's share of the full-name state dicts (collective: every rank calls)."""
        model_sd, optim_sd = get_state_dict(self.inner, optimizer, options=self.options)
        out_m, out_o = _whole_entries(self.wrapper.sub, self.wrapper.rank, model_sd, optim_sd, self.writer,
                                      self.sliced)
        for (full, stat), t in self._assemble(model_sd, optim_sd).items():
            _put(out_m, out_o, full, stat, t)
        return out_m, out_o

    @torch.no_grad()
    def _assemble(self, model_sd: dict, optim_sd: dict) -> dict[tuple[str, str], torch.Tensor]:
        """Neuron-level tensors in full shape on their writer: each group's slice from its first holder."""
        rank, group, fsdp, sub = self.wrapper.rank, self.wrapper.group, self.wrapper.fsdp, self.wrapper.sub
        out: dict[tuple[str, str], torch.Tensor] = {}
        for name, stat, dim, (start, stop), src in _slices(self.wrapper.plan, self.shapes):
            writer = self.writer[name]
            ref = model_sd.get(name, model_sd.get(name + "_held"))
            if rank == writer and (name, stat) not in out:
                out[(name, stat)] = torch.zeros(self.shapes[name], dtype=ref.dtype, device=ref.device)
            if rank not in (src, writer):
                continue
            if rank == src:
                piece = _piece(sub, name, stat, model_sd, optim_sd, dim, start, stop)
            else:
                shape = list(self.shapes[name])
                shape[dim] = stop - start
                piece = torch.empty(shape, dtype=ref.dtype, device=ref.device)
            if group is not None and src != writer:  # point to point: only the writer needs it
                if rank == src:
                    send(piece, group, writer * fsdp)  # through the host over gloo (parallel/device.py)
                elif rank == writer:
                    recv(piece, group, src * fsdp)
            if rank == writer:
                out[(name, stat)].narrow(dim, start, stop - start).copy_(piece)
        return out

    # ------------------------------------------------------------------- load
    def load_from(self, path: Path, optimizer, group=None) -> None:
        """Take this rank's subnetwork (and the matching optimizer slices) from full-name state."""
        model_sd, optim_sd = get_state_dict(self.inner, optimizer, options=self.options)
        state: dict = {"model": {}, "optim": {}}
        where = _request(self.wrapper.sub, model_sd, optim_sd, self.shapes, state)
        dcp_load(state, path, group)  # unpickles nothing but DCP's metadata classes and plain data
        model_sd, optim_sd = _taken(state, where, model_sd, optim_sd)
        set_state_dict(self.inner, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                       options=self.options)


class VirtualSDPFullState:
    """The same full-name checkpoint for virtual SDP (``sdp.virtual``): all N simulated workers in this process.

    ``container`` names worker w's module ``worker{w}.module`` (the trainer's one optimizer is over all of
    them). Saving writes what the N-process run's ranks would write together: every whole tensor from its
    writer (a component's first holder, worker 0 for the shared part), every neuron-level tensor assembled
    from each group's first holder; loading gives each worker its own subnetwork and optimizer slices. So a
    virtual run resumes a real SDP (or single, DDP, FSDP2) checkpoint and a real run resumes a virtual one.
    ``shapes``: the full model's state-dict shapes (taken before the subnetworks were cut). Uses only
    ``VirtualSDP.plan`` and ``.subs``.
    """

    def __init__(self, virtual, container, shapes: dict[str, tuple[int, ...]], options):
        self.virtual, self.container, self.shapes, self.options = virtual, container, shapes, options
        self.sliced, self.writer = _sliced(virtual.plan), _writers(virtual.plan, shapes)

    def _per_worker(self, model_sd: dict, optim_sd: dict) -> list[tuple[dict, dict]]:
        """The container's state dicts split by worker, keys without ``worker{w}.module.``."""
        out: list[tuple[dict, dict]] = [({}, {}) for _ in self.virtual.subs]
        for k, v in model_sd.items():
            w, local = _unprefix(k)
            out[w][0][local] = v
        for k, v in optim_sd.items():
            kind, rest = k.split(".", 1)
            w, local = _unprefix(rest)
            out[w][1][f"{kind}.{local}"] = v
        return out

    @torch.no_grad()
    def state_to_save(self, optimizer) -> tuple[dict, dict]:
        """The full-name state dicts, one copy of every tensor (nothing is communicated)."""
        per = self._per_worker(*get_state_dict(self.container, optimizer, options=self.options))
        out_m: dict = {}
        out_o: dict = {}
        for w, (sub, (model_sd, optim_sd)) in enumerate(zip(self.virtual.subs, per, strict=True)):
            m, o = _whole_entries(sub, w, model_sd, optim_sd, self.writer, self.sliced)
            out_m.update(m)
            out_o.update(o)
        full: dict[tuple[str, str], torch.Tensor] = {}
        for name, stat, dim, (start, stop), src in _slices(self.virtual.plan, self.shapes):
            piece = _piece(self.virtual.subs[src], name, stat, *per[src], dim, start, stop)
            if (name, stat) not in full:
                full[(name, stat)] = torch.zeros(self.shapes[name], dtype=piece.dtype, device=piece.device)
            full[(name, stat)].narrow(dim, start, stop - start).copy_(piece)
        for (name, stat), t in full.items():
            _put(out_m, out_o, name, stat, t)
        return out_m, out_o

    def load_from(self, path: Path, optimizer, group=None) -> None:
        """Every simulated worker takes its subnetwork and optimizer slices from one read of the full state."""
        model_sd, optim_sd = get_state_dict(self.container, optimizer, options=self.options)
        per = self._per_worker(model_sd, optim_sd)
        state: dict = {"model": {}, "optim": {}}
        wheres = [_request(sub, m, o, self.shapes, state) for sub, (m, o) in zip(self.virtual.subs, per, strict=True)]
        dcp_load(state, path, group)  # unpickles nothing but DCP's metadata classes and plain data
        for w, ((m, o), where) in enumerate(zip(per, wheres, strict=True)):
            m, o = _taken(state, where, m, o, own=True)
            model_sd.update({f"worker{w}.module.{k}": v for k, v in m.items()})
            optim_sd.update({f"{k.split('.', 1)[0]}.worker{w}.module.{k.split('.', 1)[1]}": v for k, v in o.items()})
        set_state_dict(self.container, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                       options=self.options)
