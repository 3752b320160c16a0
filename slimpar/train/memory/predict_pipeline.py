"""What a pipeline's memory prediction (``slimpar plan --memory``, ``parallel.mode pipeline``) assumes where a
size depends on tensor values, which FakeTensorMode does not have (docs/memory.md).

Four kinds of sizes in a pipeline step depend on values; :class:`ValueSizes` answers them:

1. ``torch.unique`` of the step's token ids (the rows of a tied embedding's or an anchor table's gradient
   part that cross a boundary): as many as the batch the run reads at that step holds. The run's own
   data is read for this count only (:class:`CountedIds`), where it is installed; where not, every token of
   a batch counts as distinct, up to the vocabulary (the most there can be); the step runs on zeros either way;
2. ``nonzero`` of the id mask stage replicas OR together: the distinct ids of all replicas' batches;
   every other ``nonzero`` and boolean-mask index (RVQ's changed and dead codebook rows): every element
   true, the worst case;
3. ``bincount`` (RVQ's code counts): ``minlength`` bins, exact since codes are < K;
4. the RVQ codebook header a receiver reads to size the rows that follow: the sender's worst case, where
   every forward changes every row: message 0 is the full table, message i the full table when i is a
   multiple of ``sync_every`` x microbatches, else a delta of all Q·K rows (version i + 1, base i). Where the
   sender is in the same process (a virtual pipeline) the receiver reads the header it sent instead, as the rows
   that follow are what that header announced: a small integer tensor made from host values (``torch.tensor``
   of a list, as a header is) reads as those values, and so do its copies (``values`` of :class:`ValueSizes`).

Sends and receives on the fake backend move nothing, and need not: a stage's receive buffers are
preallocated from static shapes (pipeline/stage.py), and the only size read off the wire is (4). What
they must do is hold their tensor as long as a real work does (:class:`HeldWork`): a gloo send or receive
keeps its tensor until the work object is dropped, which the schedule does one turn of its 1F1B loop
later; the fake backend's works hold nothing, so a sent gradient would be freed early.
The stand-ins live only in a pipeline's prediction; the other modes have no value-dependent size.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from slimpar.parallel.comm import storage_key
from slimpar.pipeline.spec import resolve_anchors

VALUE_SIZES = "distinct token ids as in the run's own batches; RVQ codebook messages at their worst case (every row)"
NO_DATA_SIZES = ("every token id of a batch distinct (the data is not installed: the worst case); RVQ codebook "
                 "messages at their worst case (every row)")
_UNIQUE = {"aten::_unique2", "aten::_unique", "aten::unique_dim", "aten::unique_consecutive"}
_COPIES = {"aten::clone", "aten::_to_copy", "aten::copy_"}  # a registered tensor's values follow these
_HOST_VALUES = 64  # integer tensors made from host values with at most this many elements are registered (item 4)


class ValueSizes(TorchDispatchMode):
    """Answers the value-dependent ops of a pipeline step (module docstring).

    ``distinct``: the distinct token ids of this step's batch (what a ``unique`` returns); ``union``: those
    of all replicas' batches; ``mask_rows``: what a ``nonzero`` returns while set (else every element);
    ``values``: storage key -> elements, which a scalar read of a registered tensor gives."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.distinct = self.union = vocab_size  # until a batch is read: the most there can be
        self.mask_rows: int | None = None
        self.values: dict[int, list[int]] = {}

    def register(self, t: torch.Tensor, values: list[int]) -> None:
        """Reads of ``t``'s elements give ``values`` for as long as its storage lives."""
        st = t.untyped_storage()
        key = storage_key(st)
        self.values[key] = values
        weakref.finalize(st, self.values.pop, key, None)

    def known(self, t: torch.Tensor) -> bool:
        return storage_key(t.untyped_storage()) in self.values

    def _follow(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """``dst``, a whole copy of a registered ``src``, reads as ``src`` does (a sent header's copies on a virtual
        pipeline's link: sent, moved, received)."""
        values = self.values.get(storage_key(src.untyped_storage()))
        if values is not None and dst.storage_offset() == 0 and dst.numel() == src.numel():
            self.register(dst, values[src.storage_offset():src.storage_offset() + src.numel()])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(is_traceable_wrapper_subclass(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)):
            return NotImplemented
        name = func._schema.name
        if name == "aten::_local_scalar_dense":
            key = storage_key(args[0].untyped_storage())
            if key in self.values:
                return self.values[key][args[0].storage_offset()]
        elif name in _UNIQUE:
            return self._unique(name, **_bound(func, args, kwargs))
        elif name == "aten::nonzero":
            t, n = args[0], self.mask_rows
            return torch.empty((t.numel() if n is None else n, t.dim()), dtype=torch.long, device=t.device)
        elif name == "aten::bincount":
            return _bincount(**_bound(func, args, kwargs))
        elif name in _COPIES:
            out = func(*args, **kwargs)
            self._follow(args[1] if name == "aten::copy_" else args[0], out)
            return out
        elif name == "aten::lift_fresh" and _host_ints(args[0]):  # torch.tensor([...]) of host integers
            out = func(*args, **kwargs)
            with _disable_current_modes():  # read on the host, not answered by the fake mode below
                self.register(out, args[0].reshape(-1).tolist())
            return out
        elif name == "aten::index" and any(i is not None and i.dtype == torch.bool for i in args[1]):
            return func(args[0], [_all_true(i) for i in args[1]])
        return func(*args, **kwargs)

    def _unique(self, name: str, self_: torch.Tensor, return_inverse: bool = False, return_counts: bool = False,
                dim: int | None = None, **_) -> tuple[torch.Tensor, ...]:
        """(values, inverse, counts) with min(numel, ``distinct``) values."""
        if dim is not None:
            raise UnpredictableOp("torch.unique over a dimension: its size depends on the values")
        t, u = self_, min(self_.numel(), self.distinct)
        values = torch.empty((u,), dtype=t.dtype, device=t.device)
        inverse = _maybe(return_inverse, t.shape, t.device)
        if name == "aten::_unique":
            return values, inverse
        return values, inverse, _maybe(return_counts, (u,), t.device)


class UnpredictableOp(RuntimeError):
    """An op whose output size depends on tensor values the prediction does not have, and for which no
    worst-case or exact size is known: the prediction stops and says which op, rather than guess."""

    def __init__(self, what: str) -> None:
        super().__init__(f"memory prediction: {what}; this run's memory cannot be predicted without running it")


def _bound(func, args, kwargs) -> dict:
    """An op's arguments by name, defaults filled in (``self`` as ``self_``)."""
    schema = func._schema.arguments
    out = {a.name: a.default_value for a in schema if a.has_default_value()}
    out.update(zip((a.name for a in schema), args, strict=False))  # args may stop early
    out.update(kwargs)
    out["self_"] = out.pop("self")
    return out


def _host_ints(t: torch.Tensor) -> bool:
    """A real (not fake) small integer tensor: its values are known on the host."""
    from torch._subclasses.fake_tensor import FakeTensor

    return (not isinstance(t, FakeTensor) and not t.is_floating_point() and not t.is_complex()
            and t.numel() <= _HOST_VALUES)


def _bincount(self_: torch.Tensor, weights: torch.Tensor | None = None, minlength: int = 0) -> torch.Tensor:
    """``minlength`` bins: the size whenever every value is below it (RVQ's codes are below K)."""
    if minlength <= 0:
        raise UnpredictableOp("torch.bincount without minlength: its size is max(values) + 1")
    return torch.empty((minlength,), dtype=torch.long if weights is None else weights.dtype, device=self_.device)


def _maybe(wanted: bool, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.empty(shape if wanted else (0,), dtype=torch.long, device=device)


def _all_true(index: torch.Tensor | None):
    """A boolean mask index as the long indices of its worst case: every element selected."""
    if index is None or index.dtype != torch.bool:
        return index
    if index.dim() != 1:
        raise UnpredictableOp("indexing by a multi-dimensional boolean mask: its size depends on the values")
    return torch.empty((index.numel(),), dtype=torch.long, device=index.device)


class HeldWork:
    """A work of the fake backend that keeps its tensor alive for its own lifetime, as gloo's do."""

    def __init__(self, work, tensor: torch.Tensor):
        self.work, self.tensor = work, tensor

    def __getattr__(self, name: str):
        return getattr(self.work, name)

    def __bool__(self) -> bool:
        return self.work is not None


@contextlib.contextmanager
def held_p2p() -> Iterator[None]:
    """``isend`` / ``irecv`` (also as the ops of ``P2POp`` and ``batch_isend_irecv``) return :class:`HeldWork`."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    saved = c10d.isend, c10d.irecv

    def held(op):
        def call(tensor: torch.Tensor, *args, **kwargs):
            return HeldWork(op(tensor, *args, **kwargs), tensor)
        return call

    c10d.isend, c10d.irecv = dist.isend, dist.irecv = held(saved[0]), held(saved[1])
    try:
        yield
    finally:
        c10d.isend, c10d.irecv = dist.isend, dist.irecv = saved


def codebook_header(decoder) -> list[int]:
    """The header of the next codebook message ``decoder`` receives, in the sender's worst case (item 4):
    [version, base_version, kind (1 delta, 2 full), rows]. Before message i >= 1 the receiver holds
    version i; before message 0 it holds -1."""
    q = decoder.spec.rvq
    rows, held = q.levels * q.codebook, decoder.codebook.version
    i = max(held, 0)
    full_every = q.sync_every * decoder.spec.microbatches
    full = i == 0 or (full_every and i % full_every == 0)
    return [i + 1, held if i else -1, 2 if full else 1, rows]


class CountedIds:
    """The prediction's batches of zeros (``fake``'s), each read also from the run's own data at the same
    step, for how many distinct token ids it holds, which ``sizes`` then answers for (items 1 and 2)."""

    kind = "text"

    def __init__(self, cfg, fake, sizes: ValueSizes):
        self.cfg, self.fake, self.sizes = cfg, fake, sizes
        self.vocab_size = fake.vocab_size
        self._data = None
        self.installed = data_installed(cfg)  # a prediction never needs the data: without it, the worst case

    def train_batch(self, step: int, rank: int, world: int, global_batch: int, seq_len: int):
        from torch.utils._python_dispatch import _disable_current_modes

        from slimpar.train.build import build_data

        if not self.installed:  # ``sizes`` keeps its worst case
            return self.fake.train_batch(step, rank, world, global_batch, seq_len)
        with _disable_current_modes():  # real tensors, out of the step's accounting
            if self._data is None:
                self._data = build_data(self.cfg)
            ids = [self._data.train_batch(step, r, world, global_batch, seq_len)[0] for r in range(world)]
            self.sizes.distinct = int(torch.unique(ids[rank]).numel())
            self.sizes.union = int(torch.unique(torch.cat([t.reshape(-1) for t in ids])).numel())
        return self.fake.train_batch(step, rank, world, global_batch, seq_len)


def data_installed(cfg) -> bool:
    """Whether the run's corpus and tokenizer are there to be read (the start-up check's cheap look: no import)."""
    from slimpar.config import ConfigError
    from slimpar.data.sources import check_available

    try:
        check_available(cfg)
    except ConfigError:
        return False
    return True


def value_sizes_text(cfg) -> str:
    """What the prediction of ``cfg``'s pipeline assumed of its value-dependent sizes, in one line."""
    return VALUE_SIZES if data_installed(cfg) else NO_DATA_SIZES


@contextlib.contextmanager
def pipeline_stand_ins(vocab_size: int) -> Iterator[ValueSizes]:
    """The stand-ins of the module docstring for one prediction: RVQ receivers read worst-case headers,
    the replicas' id mask has the union's rows, sends and receives hold their tensors."""
    from slimpar.pipeline.boundary import BoundaryDecoder
    from slimpar.train.strategies.pipeline import PipelineStrategy

    sizes = ValueSizes(vocab_size)
    saved = BoundaryDecoder.extra_spec, PipelineStrategy._touched_rows

    def extra_spec(self, fixed):
        if self.spec.rvq is not None and self.training and not sizes.known(fixed[1]):  # a header from another rank
            sizes.register(fixed[1], codebook_header(self))
        return saved[0](self, fixed)

    def touched_rows(self):
        sizes.mask_rows = sizes.union
        try:
            return saved[1](self)
        finally:
            sizes.mask_rows = None

    BoundaryDecoder.extra_spec, PipelineStrategy._touched_rows = extra_spec, touched_rows
    try:
        with held_p2p(), sizes:  # deep copies of fake tensors: memory_predict._fake_friendly
            yield sizes
    finally:
        BoundaryDecoder.extra_spec, PipelineStrategy._touched_rows = saved


def describe_pipeline(cfg) -> str:
    """A pipeline's workload in a few words: stages, replicas, codec, batch per replica in microbatches."""
    pc, t = cfg.pipeline, cfg.train
    replicas = 1 if pc.virtual else cfg.parallel.workers // pc.stages
    anchors = resolve_anchors(pc.codec, pc.anchors)
    codec = pc.codec + (f" ({pc.codec_options})" if pc.codec_options else "")
    codec += f" + anchors {anchors}" if anchors != "none" else ""
    codec += f" + RVQ {pc.rvq.levels}x{pc.rvq.codebook}" if pc.rvq.levels else ""
    where = "all in one worker (virtual)" if pc.virtual else f"{replicas} replica(s), one stage per worker"
    return (f"pipeline {pc.stages} stages, {where}, codec {codec}, {pc.schedule}, global batch {t.batch_size} "
            f"({t.batch_size // replicas} per replica in {pc.microbatches} microbatches)")


def stage_label(cfg, rank: int) -> str:
    """What a pipeline worker holds: ``stage s`` (``/ replica r`` with replicas), or every stage (virtual)."""
    pc = cfg.pipeline
    if pc.virtual:
        return f"stages 0-{pc.stages - 1}"
    replicas = cfg.parallel.workers // pc.stages
    label = f"stage {rank % pc.stages}"
    return label + (f" / replica {rank // pc.stages}" if replicas > 1 else "")


def value_stand_ins(cfg, vocab_size: int) -> contextlib.AbstractContextManager:
    """:func:`pipeline_stand_ins` for a pipeline run (its :class:`ValueSizes`), nothing (None) otherwise."""
    return pipeline_stand_ins(vocab_size) if cfg.parallel.mode == "pipeline" else contextlib.nullcontext()
