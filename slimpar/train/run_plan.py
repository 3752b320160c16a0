"""The run plan: everything a run config resolves to before any process starts, worked out once per process.

:func:`run_plan` resolves a config (and the vocabulary its model will have) to a :class:`RunPlan` that holds:

- the mode (:mod:`slimpar.train.modes`), the strategy it asks for, and how its workers map to processes;
- the run's model on the meta device (structure and sizes; nothing is allocated);
- the SDP plan (``slimpar.train.strategies.sdp_plan.plan_from_config``, with the run's seed);
- the codec specs of a pipeline's boundaries, with their rank r (``slimpar.train.strategies.pipeline_specs``);
- the stage layout (the blocks' cuts) and the predicted memory floor of every rank.

Each part is computed when first read and kept; the plan is kept per process for its config, so the start-up
checks, the memory floor, the launcher, ``slimpar plan`` and (in the worker, which rebuilds it once from the
config it receives) the strategies and checkpoints all read one answer. Nothing here communicates.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from slimpar.config import Config, to_dict
from slimpar.train.modes import Mode, mode_of

if TYPE_CHECKING:
    from torch import nn

    from slimpar.pipeline.spec import CodecSpec
    from slimpar.sdp.plan import Plan

__all__ = ["PROCESS_BYTES", "RunPlan", "run_plan"]

STATE_BYTES_PER_PARAM = 16  # fp32 parameter + gradient + AdamW exp_avg + exp_avg_sq
PROCESS_BYTES = 256 << 20  # an idle worker: Python, torch and a gloo group (about 270 MiB of RSS measured)


# in-place random fills of a tensor: on the meta device torch runs Python references for them, which import
# torch._dynamo (about a second of every launcher's start, measured on this project's CPU machine)
_FILLS = frozenset({"normal_", "uniform_", "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_",
                    "random_"})


def _no_fills_on_meta():
    """A torch-function mode in which ``torch.nn.init``'s in-place initialisers and a tensor's random fills leave a
    meta tensor as it is: it holds no values to set, only the shape and dtype the plan reads."""
    import torch
    from torch.overrides import TorchFunctionMode

    class _Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            first = args[0] if args else (kwargs or {}).get("tensor")  # torch.nn.init passes it by name
            name = getattr(func, "__name__", "")
            skip = (getattr(func, "__module__", "") == "torch.nn.init" and name.endswith("_")) or name in _FILLS
            if skip and isinstance(first, torch.Tensor) and first.is_meta:
                return first
            return func(*args, **(kwargs or {}))

    return _Mode()


@dataclass(frozen=True, eq=False)
class RunPlan:
    """One run config resolved (module docstring). ``vocab``: the model's vocabulary (None for images)."""

    cfg: Config
    vocab: int | None

    @property
    def mode(self) -> Mode:
        return mode_of(self.cfg)

    @property
    def kind(self) -> str:
        """The strategy the run asks for (slimpar.train.strategies.build_strategy)."""
        return self.mode.kind(self.cfg)

    @property
    def in_process(self) -> bool:
        """Every worker in the launching process (no process group)."""
        return self.mode.in_process(self.cfg)

    @property
    def workers(self) -> int:
        """Processes of the run (``parallel.workers``; under torchrun its world)."""
        return self.cfg.parallel.workers

    @property
    def data_parallel(self) -> int:
        """Ranks that each read their own share of the global batch."""
        return self.mode.data_parallel(self.cfg)

    @cached_property
    def meta_model(self) -> nn.Module:
        """The run's model on the meta device: structure and sizes without memory, built once per model section
        and vocabulary (the settings a memory floor suggests instead, other keeps or workers, share it)."""
        import torch

        from slimpar.train.build import build_model

        vocab = self.vocab if self.cfg.model.arch == "llama" else None
        key = (json.dumps(asdict(self.cfg.model), sort_keys=True), vocab)
        if key not in _META_MODELS:

            class _Vocab:  # build_model reads only vocab_size from the data
                vocab_size = vocab

            if len(_META_MODELS) >= 4:
                _META_MODELS.clear()
            with torch.device("meta"), _no_fills_on_meta():
                _META_MODELS[key] = build_model(self.cfg, _Vocab() if vocab else None)
        return _META_MODELS[key]

    @cached_property
    def param_bytes(self) -> list[tuple[str, int]]:
        """(name, bytes) of every parameter (a tied one once)."""
        params = {id(p): (n, p.numel() * p.element_size()) for n, p in self.meta_model.named_parameters()}
        return list(params.values())

    @cached_property
    def sdp(self) -> Plan:
        """The SDP plan over the mode's workers (``sdp.memory_budget``: the launcher's prediction chooses the keeps;
        the config it hands the workers carries them as ``sdp.keep_per_worker``)."""
        from slimpar.train.strategies.sdp_plan import plan_from_config

        return plan_from_config(self.cfg, self.meta_model, self.mode.workers(self.cfg))

    @cached_property
    def sdp_shared_bytes(self) -> int:
        """Bytes of the parameters no SDP component holds (every worker keeps them), without planning."""
        from slimpar.sdp.components import model_components

        s = self.cfg.sdp
        kw = {} if self.cfg.model.arch == "llama" else {"input_shape": (1, self.cfg.model.in_channels, 32, 32)}
        return model_components(self.meta_model, s.level, s.groups or 4, **kw)[2]

    @cached_property
    def codecs(self) -> list[CodecSpec]:
        """One codec spec per boundary, at the run's rank r (the one place r is decided)."""
        from slimpar.train.build import llama_config
        from slimpar.train.strategies.pipeline_specs import codec_specs

        lc = llama_config(self.cfg, vocab_size=self.vocab)
        return codec_specs(self.cfg, lc.dim, lc.vocab_size)

    @cached_property
    def cuts(self) -> list[int]:
        """The last block before each pipeline boundary (what a checkpoint's layout records)."""
        from slimpar.train.modes.pipeline import Pipeline

        return Pipeline().cuts(self.cfg)

    @cached_property
    def floors(self) -> list[int]:
        """The least bytes each rank holds (one entry per process): its fp32 state (the mode's
        ``state_bytes``), an idle process (:data:`PROCESS_BYTES`) and, where it computes the loss, one
        micro-batch's logits with their gradient."""
        total = sum(b for _, b in self.param_bytes)
        logits = self.logits_bytes
        return [s + PROCESS_BYTES + (logits if self.mode.holds_logits(self.cfg, r) else 0)
                for r, s in enumerate(self.mode.state_bytes(self, total))]

    @cached_property
    def logits_bytes(self) -> int:
        """fp32 logits and their gradient for one worker's micro-batch (text); images: a negligible head."""
        cfg = self.cfg
        if cfg.data.kind != "text":
            return 0
        from slimpar.train.build import llama_config

        v = llama_config(cfg, vocab_size=self.vocab).vocab_size
        per_worker = cfg.train.batch_size // max(1, self.data_parallel * cfg.train.grad_accum)
        return 2 * 4 * max(1, per_worker) * cfg.data.seq_len * v


_META_MODELS: dict[tuple, nn.Module] = {}  # (model section, vocabulary) -> its meta-device model
_PLANS: dict[str, RunPlan] = {}
_KEEP = 16  # plans kept per process: the run's, and the few settings a memory floor suggests instead


def _numbers_as_floats(value):
    """A config's values with 300 and 300.0 one key (a config read back from TOML or a dict types them again)."""
    if isinstance(value, dict):
        return {k: _numbers_as_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers_as_floats(v) for v in value]
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def run_plan(cfg: Config, vocab: int | None = None) -> RunPlan:
    """The run plan of ``cfg``, one per process for each config (and vocabulary: by default the one the config
    names, ``slimpar.data.vocab.config_vocab_size``, for text; None for images)."""
    if vocab is None and cfg.data.kind == "text":
        from slimpar.data.vocab import config_vocab_size

        vocab = config_vocab_size(cfg)
    key = json.dumps([_numbers_as_floats(to_dict(cfg)), vocab], sort_keys=True, default=str)
    if key not in _PLANS:
        if len(_PLANS) >= _KEEP:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[key] = RunPlan(copy.deepcopy(cfg), vocab)  # a snapshot: a caller may change its config later
    return _PLANS[key]
