"""Per-worker memory of a run at any size, without allocating it (``slimpar plan --memory``).

Algorithm, for each rank r of the run's ``parallel.workers``:

1. this process joins a fake process group of that world size as rank r (torch's ``fake`` backend:
   every collective returns at once and moves nothing);
2. under ``FakeTensorMode`` (tensors carry shape, dtype and storage size, never data) the trainer's own
   builders make the run's model, rank r's strategy (its SDP subnetwork, holder groups, FSDP2 shards,
   activation checkpointing, DDP buckets) and the optimizer;
3. the trainer's own steps run on fake batches of the real shapes: steps before ``log.measure_step``
   plainly (so the optimizer state exists, as in a run), that step under ``TrainStep.measured`` (train/step.py), the
   same :class:`~slimpar.parallel.comm.StepInstrument` and storage accounting a real run records.

The parts are therefore the ones a run writes to ``summary.json`` (``per_rank[i]["mem"]``): parameters,
gradients, optimizer state, buffers, activations saved for backward and ``peak_live``. Reads of a scalar
(the loss, the gradient norm, AdamW's step) give 1 (:class:`_FakeScalars`); the NaN guard is skipped, its tensors are
hidden from the instrument in a run too.
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from slimpar.config import Config
from slimpar.data.shares import batch_share

MEM_FIELDS = ("params", "grads", "optimizer", "buffers", "activations", "peak_live", "peak_step_alloc")
_SCALAR_OPS = {"aten::_local_scalar_dense", "aten::is_nonzero"}


class _FakeScalars(TorchDispatchMode):
    """Answers a read of a fake tensor's value (``.item()``, ``float(t)``, ``bool(t)``) with one (True): a
    finite loss and norm, and a nonzero step count for AdamW's bias correction."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        if any(is_traceable_wrapper_subclass(t) for t in leaves if isinstance(t, torch.Tensor)):
            return NotImplemented
        if func._schema.name in _SCALAR_OPS:
            t = args[0]
            if func._schema.name == "aten::is_nonzero" or t.dtype == torch.bool:
                return True
            return 1.0 if t.dtype.is_floating_point else 1
        return func(*args, **kwargs)


class _FakeText:
    """Stands in for TextData: batches of zeros with the real shapes (``train_batch``'s share rule)."""

    kind = "text"

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def train_batch(self, step: int, rank: int, world: int, global_batch: int, seq_len: int):
        b = len(batch_share(step, rank, world, global_batch))
        win = torch.zeros((b, seq_len + 1), dtype=torch.long)  # (b, T + 1), cut as TextData cuts it:
        return win[:, :-1].contiguous(), win[:, 1:].contiguous()  # one sequence: both views of one storage


@contextlib.contextmanager
def _fake_friendly() -> Iterator[None]:
    """Two things that read tensor data at set-up are skipped: DDP's start-up check of parameter shapes
    and its broadcast of rank 0's weights (C++ code that reads the bytes; neither leaves memory behind).
    Device meshes are built on real tensors (their rank tables are read); gathered objects are this rank's.
    And ``Module.to("cpu")`` leaves a module of fake CPU tensors as it is: it already is there, and torch
    would swap every fake parameter for a copy (which fails for a tied one). A deep copy of a fake tensor
    (virtual SDP copies the model per worker) stays in this fake mode."""
    import torch.distributed.fsdp._fully_shard._fully_shard as fsdp
    import torch.nn.parallel.distributed as ddp
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.distributed.device_mesh import DeviceMesh

    saved = (nn.Module.to, ddp._verify_param_shape_across_processes, ddp._sync_module_states, dist.all_gather_object)
    meshes = (DeviceMesh.__dict__["from_group"], fsdp._init_default_mesh)
    original = saved[0]

    def to(self: nn.Module, *args, **kwargs) -> nn.Module:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is None and (device is None or device.type == "cpu"):
            return self
        if dtype is None and device.type == "meta":
            return _to_meta(self)
        return original(self, *args, **kwargs)

    nn.Module.to = to
    FakeTensor.__deepcopy__ = _copy_fake  # virtual SDP's workers: deep copies of one fake model
    ddp._verify_param_shape_across_processes = ddp._sync_module_states = lambda *a, **k: None
    dist.all_gather_object = _own_object_everywhere
    DeviceMesh.from_group = staticmethod(_real(DeviceMesh.from_group))
    fsdp._init_default_mesh = _real(fsdp._init_default_mesh)
    try:
        yield
    finally:
        nn.Module.to, ddp._verify_param_shape_across_processes, ddp._sync_module_states, dist.all_gather_object = saved
        DeviceMesh.from_group, fsdp._init_default_mesh = meshes
        del FakeTensor.__deepcopy__


def _copy_fake(t: torch.Tensor, memo: dict) -> torch.Tensor:
    """A deep copy of a fake tensor in the same fake mode (a copied mode would make each of the copy's views a
    tensor of another mode, converted afresh, with a new storage, at every use), its real constant (a small
    tensor's value, e.g. BatchNorm's batch count) copied as the real tensor it is."""
    memo.setdefault(id(t.fake_mode), t.fake_mode)
    if t.constant is not None and id(t.constant) not in memo:
        memo[id(t.constant)] = _real(copy.deepcopy)(t.constant)
    return torch.Tensor.__deepcopy__(t, memo)


def _to_meta(module: nn.Module) -> nn.Module:
    """``module.to("meta")`` by replacing each parameter and buffer: ``Module._apply`` swaps a fake tensor for
    its converted copy, which fails where another reference holds it (the hybrid's block skeletons at 1B)."""
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is not None:
                m._parameters[name] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"),
                                                   requires_grad=p.requires_grad)
        for name, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device="meta")
    return module


def _own_object_everywhere(object_list: list, obj, group=None) -> None:
    """``all_gather_object`` on the fake backend: every rank's object is taken to be this one's. Where ranks
    agree on the groups to create (SDP's holder groups: pure functions of the plan) this is the result."""
    object_list[:] = [obj] * len(object_list)


def _real(fn: Callable) -> Callable:
    """``fn`` run on real tensors: a DeviceMesh keeps its rank table, which fake tensors cannot hold."""
    from torch.utils._python_dispatch import _disable_current_modes

    def call(*args, **kwargs):
        with _disable_current_modes():
            return fn(*args, **kwargs)

    return call


def _mean_in_place(state, bucket):  # no annotation: DDP checks it against a non-string type
    """DDP's default all-reduce hook as the fake backend can run it: the bucket divided in place and
    all-reduced in place (the fake collective's future carries no tensor, which DDP's C++ hook expects)."""
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size())
    dist.all_reduce(buffer)
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(buffer)
    return fut


class _BucketsKept:
    """DDP's reducer without its one re-bucketing at the second step (C++ that reads a broadcast index
    tensor). The new buckets would hold the same gradients in another order: the same bytes."""

    def __init__(self, reducer) -> None:
        self._reducer = reducer

    def __getattr__(self, name: str):
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        return False


class _Pass:
    """A guard that lets every step through (the real one reads values; its memory is not counted)."""

    skipped: list[int] = []
    loss = gnorm = mean_loss = 0.0  # what the step reads after a check: no values under fake tensors
    signal = 0

    def check(self, *args, **kwargs) -> bool:
        return True


def predict_memory(cfg: Config, ranks: list[int] | None = None, vocab_size: int | None = None) -> list[dict]:
    """The ``mem`` record of each rank in ``ranks`` (default: all of ``cfg.parallel.workers``) at step
    ``log.measure_step``, predicted under FakeTensorMode. ``vocab_size``: the tokenizer's (default: the one the
    config names, slimpar.data.vocab; a real run takes the trained tokenizer's), so no data or tokenizer is needed."""
    from slimpar.data.vocab import config_vocab_size

    world = cfg.parallel.workers
    vocab = vocab_size or config_vocab_size(cfg)
    return [{"rank": r, **predict_rank(cfg, r, world, vocab)} for r in (range(world) if ranks is None else ranks)]


def predict_rank(cfg: Config, rank: int, world: int, vocab_size: int) -> dict:
    """One rank's ``mem`` record (see :func:`predict_memory`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from slimpar.train.memory.predict_pipeline import value_stand_ins

    if dist.is_initialized():
        raise RuntimeError("predict_memory needs a process without a process group")
    cfg = replace(cfg, parallel=replace(cfg.parallel, device="cpu"))
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        with tempfile.TemporaryDirectory() as tmp, _fake_friendly(), \
                FakeTensorMode(allow_non_fake_inputs=True), _FakeScalars(), value_stand_ins(cfg, vocab_size) as sizes:
            mem = _measure(cfg, rank, world, vocab_size, Path(tmp), sizes)
    finally:
        dist.destroy_process_group()
    return {k: int(mem[k]) for k in MEM_FIELDS}


def _measure(cfg: Config, rank: int, world: int, vocab_size: int, out: Path, sizes=None) -> dict:
    """Build the run's pieces as ``Trainer._build`` does and run its step up to the measured one; ``sizes``: a
    pipeline's value-dependent sizes (memory_predict_pipeline.py), read off the run's own batches."""
    from slimpar.train.job.context import RunContext
    from slimpar.train.memory.predict_pipeline import CountedIds
    from slimpar.train.run_plan import run_plan
    from slimpar.train.step import TrainStep
    from slimpar.train.strategies import build_strategy

    ctx = RunContext(rank=rank, world=world, device=torch.device("cpu"), out_dir=out, group=dist.group.WORLD,
                     timeout=timedelta(seconds=cfg.parallel.timeout_s))
    data = _data(cfg, vocab_size)
    if sizes is not None:
        data = CountedIds(cfg, data, sizes)
    strategy = build_strategy(run_plan(cfg, vocab_size), _model(cfg, vocab_size), ctx)
    if isinstance(strategy.module, nn.parallel.DistributedDataParallel):
        strategy.module.register_comm_hook(None, _mean_in_place)
        strategy.module.reducer = _BucketsKept(strategy.module.reducer)
    # no writer, sinks or run files: only the step, with a guard that lets every step through
    steps = TrainStep(cfg, ctx, data, strategy, strategy.build_optimizer(cfg), _Pass())
    measure_at = max(min(cfg.log.measure_step, steps.total - 1), 0)
    for step in range(measure_at):
        steps.run(step)
        strategy.end_of_step(step)
    _, record = steps.measured(measure_at)
    return record["mem"]


def _model(cfg: Config, vocab_size: int) -> nn.Module:
    """The run's model as ``build_model`` makes it; with ``model.init_from`` the folder's shape only (its
    config.json and vocabulary), no weights read."""
    from slimpar.train.build import build_model

    if cfg.model.init_from:
        from slimpar.models.hf_llama import read_hf_config
        from slimpar.models.llama import Llama

        torch.manual_seed(cfg.train.seed)
        return Llama(read_hf_config(cfg.model.init_from, weights=False))
    return build_model(cfg, _data(cfg, vocab_size))


def _data(cfg: Config, vocab_size: int):
    """The stand-in for the run's data: token windows, or images (slimpar.train.memory.stand_ins)."""
    if cfg.data.kind == "text":
        return _FakeText(vocab_size)
    from slimpar.train.memory.stand_ins import fake_images

    return fake_images(cfg)
