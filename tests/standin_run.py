"""Every rank of a run config on the stand-in accelerator (tests/standin_device.py): the trainer's own steps,
guard, clipping, replica checks and logged-loss reduction, then evaluation, the export's state dict and the
checkpoint's communication. ``python -m tests.standin_run MODE...`` runs modes of :data:`MODES` one after another
and prints one JSON line per rank: what evaluation returned (and a pipeline's clip norm's device in every
``pipeline.clip_projector`` mode), or the error that stopped the mode. Modes that shard
with FSDP2 get a process each: DTensor keeps what it learnt of a group by the group's name, which the next fake
world reuses for a group of another size.
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tests.standin_device import standin_accelerator

TINY = Path(__file__).resolve().parents[1] / "configs" / "llama_tiny.toml"
BASE = ["--train.steps", "3", "--eval.batches", "1", "--data.ood", "none", "--sdp.check_every", "1",
        "--train.grad_clip", "1.0", "--pipeline.checksum_every", "1"]
_SDP = ["--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.keep", "0.5"]
_VIRTUAL = ["--parallel.mode", "sdp", "--parallel.workers", "1", "--sdp.virtual", "true", "--sdp.virtual_workers", "2",
            "--sdp.keep", "0.5"]
_PIPE = ["--parallel.mode", "pipeline", "--parallel.workers", "2", "--pipeline.stages", "2"]
_VIRTUAL_PIPE = ["--parallel.mode", "pipeline", "--parallel.workers", "1", "--pipeline.stages", "2",
                 "--pipeline.virtual", "true"]
_HYBRID = ["--parallel.mode", "pipeline", "--parallel.workers", "4", "--pipeline.stages", "2", "--pipeline.dp", "sdp",
           "--pipeline.sdp_keep", "0.5"]
CODECS = {  # every pipeline.codec (and MAPL + RVQ): the test checks this against CODEC_KINDS
    "none": ["--pipeline.codec", "none"],
    "bf16": ["--pipeline.codec", "bf16"],
    "int8": ["--pipeline.codec", "int8"],
    "mapl": ["--pipeline.codec", "mapl"],
    "mapl-rvq": ["--pipeline.codec", "mapl", "--pipeline.rvq.levels", "2"],
    "ssn": ["--pipeline.codec", "ssn", "--model.tie_embeddings", "false"],
    "naive": ["--pipeline.codec", "naive"],
}
MODES = {
    "ddp": ["--parallel.mode", "ddp", "--parallel.workers", "2"],
    "fsdp": ["--parallel.mode", "fsdp", "--parallel.workers", "2"],
    "sdp-block": _SDP,
    "sdp-block-backward": [*_SDP, "--sdp.regime", "backward"],
    "sdp-neuron": [*_SDP, "--sdp.level", "neuron"],
    "sdp-neuron-backward": [*_SDP, "--sdp.level", "neuron", "--sdp.regime", "backward"],
    "sdp-holder-fsdp": [*_SDP, "--sdp.holder_shard", "true"],
    "sdp-fsdp2": ["--parallel.mode", "sdp", "--parallel.workers", "4", "--sdp.keep", "0.5", "--sdp.fsdp", "2"],
    "sdp-virtual": _VIRTUAL,
    "sdp-virtual-batched": [*_VIRTUAL, "--sdp.virtual_batched", "true"],
    **{f"pipeline-{codec}": [*_PIPE, *args] for codec, args in CODECS.items()},
    "pipeline-virtual": [*_VIRTUAL_PIPE, *CODECS["mapl"]],
    # the virtual pipeline with every other codec, in bf16 (where issue 46's clip failed on a GPU), and the hybrid
    # without a projector: every codec on every pipeline layout, each clipped in every mode (_clip_every_mode)
    **{f"pipeline-virtual-{codec}": [*_VIRTUAL_PIPE, *args, "--train.dtype", "bf16"]
       for codec, args in CODECS.items() if codec != "mapl"},
    "hybrid": [*_HYBRID, *CODECS["mapl"]],
    "hybrid-none": [*_HYBRID, *CODECS["none"]],
}


class StandInText:
    """Token batches of zeros of the real shapes (the memory prediction's), validation splits too; target bytes
    are counted from the host batch (one per token) and refused for a device one (a read back per batch)."""

    kind = "text"

    def __init__(self, vocab_size: int):
        from slimpar.train.memory.predict import _FakeText

        self.vocab_size = vocab_size
        self.train_batch = _FakeText(vocab_size).train_batch
        self.val_streams = {"heldout": None}

    def val_batches(self, split: str, batch_size: int, batches: int, seq_len: int) -> list:
        return [self.train_batch(0, 0, 1, batch_size, seq_len) for _ in range(batches)]

    def target_bytes(self, y: torch.Tensor) -> int:
        if y.device.type != "cpu":
            raise AssertionError(f"target_bytes reads the host batch; it was given a {y.device} tensor")
        return y.numel()


def config(mode: str):
    from slimpar.train.validate.checks import load_run_config

    return load_run_config(str(TINY), BASE + MODES[mode], training=False)


def run_on_standin(cfg, rank: int, out: Path, steps: int = 2) -> dict:
    """Rank ``rank`` of ``cfg.parallel.workers`` (module docstring); returns the names of what evaluation gave
    (``eval``), the last step's copies between the host and the device that wait for it, by kind and call site
    (``copies``), and, for a pipeline, the device of the clip norm in each clip mode (``clip``)."""
    from slimpar.parallel.syncs import SyncCounter
    from slimpar.train.memory.predict_pipeline import value_stand_ins

    with standin_accelerator(rank, cfg.parallel.workers) as device:
        run = standin_trainer(cfg, rank, device, out)
        s = run.strategy
        with value_stand_ins(cfg, run.data.vocab_size):  # a pipeline's value-dependent sizes
            for step in range(steps):
                with SyncCounter() as counter:
                    loss, _ = run.run(step)
                s.end_of_step(step)
                s.reduce_loss(loss)
            clip = _clip_every_mode(s, cfg.train.grad_clip)
            results = s.evaluate(run.data, cfg)
            s.full_state_dict()
            _checkpoint_state(s, run.optimizer)
    # a copy to the host, or from it without non_blocking, waits for the device's queue (slimpar.parallel.syncs): on
    # a CPU run it is no copy at all, so only this device shows it
    copies = {k: v for k, v in counter.count.syncs.items() if k.startswith(("copy from host", "copy to host"))}
    return {"eval": sorted(results), "copies": copies, **({"clip": clip} if clip else {})}


def _clip_every_mode(strategy, max_norm: float) -> dict[str, str]:
    """A pipeline's clip in every ``pipeline.clip_projector`` mode, on the last step's gradients: mode -> the
    norm's device. The mode enters the clip alone (``MaplTrainingSpec.clip``), so this is each mode's clip without
    a run per mode; a rank without a projector of its own (a codec without one, MAPL's last stage) has an empty
    part in ``separate``, whose zero once sat on the CPU (issue 46)."""
    import dataclasses

    from slimpar.pipeline.training import CLIP_MODES

    spec = getattr(strategy, "mapl_spec", None)
    if spec is None:
        return {}
    out = {}
    for mode in CLIP_MODES:
        strategy.mapl_spec = dataclasses.replace(spec, clip=mode)
        out[mode] = strategy.clip_grad_norm(max_norm).device.type
    strategy.mapl_spec = spec
    return out


def standin_trainer(cfg, rank: int, device: torch.device, out: Path):
    """The trainer's step as ``Trainer._build`` makes it (strategy, optimizer, the real guard; train/step.py), inside
    :func:`standin_accelerator`, without its writer, sinks or run files."""
    from slimpar.train.build import build_model
    from slimpar.train.guard import StepGuard
    from slimpar.train.job.context import RunContext
    from slimpar.train.job.preempt import STOP_SIGNALS
    from slimpar.train.run_plan import run_plan
    from slimpar.train.step import TrainStep
    from slimpar.train.strategies import build_strategy

    ctx = RunContext(rank=rank, world=cfg.parallel.workers, device=device, out_dir=out, group=dist.group.WORLD,
                     timeout=timedelta(seconds=cfg.parallel.timeout_s))
    data = StandInText(cfg.model.vocab_size or cfg.data.vocab_size)
    run = run_plan(cfg, data.vocab_size)
    strategy = build_strategy(run, build_model(cfg, data), ctx)  # on the CPU; the strategy moves it
    _ddp_on_fake_backend(strategy)
    guard = StepGuard(cfg.train.skip_bad_steps, ctx.group, cfg.train.lr, rank, STOP_SIGNALS)
    # an inactive stop request, as Trainer.__init__ makes it without a worker's
    return TrainStep(cfg, ctx, data, strategy, strategy.build_optimizer(cfg), guard)


def _ddp_on_fake_backend(strategy) -> None:
    """DDP's all-reduce hook as the fake backend can run it (its futures carry no tensor)."""
    from torch import nn

    from slimpar.train.memory.predict import _BucketsKept, _mean_in_place

    if isinstance(strategy.module, nn.parallel.DistributedDataParallel):
        strategy.module.register_comm_hook(None, _mean_in_place)
        strategy.module.reducer = _BucketsKept(strategy.module.reducer)


def _checkpoint_state(strategy, optimizer) -> None:
    """What ``save_checkpoint`` communicates before DCP writes (SDP: its neuron-level pieces, sent to their
    writers; FSDP2: the sharded state dicts)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from slimpar.train.checkpoint.dcp import OPTIONS

    module = strategy.checkpoint_module
    if hasattr(module, "state_to_save"):
        module.state_to_save(optimizer)
    else:
        get_state_dict(module, optimizer, options=OPTIONS)


def main(modes: list[str]) -> None:
    for mode in modes:
        cfg = config(mode)
        for rank in range(cfg.parallel.workers):
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    record = run_on_standin(cfg, rank, Path(tmp))
            except Exception:  # the next mode still runs; the test names this one's error
                record = {"error": traceback.format_exc()[-3000:]}
            print(json.dumps({"mode": mode, "rank": rank, **record}), flush=True)
            if "error" in record:
                break


if __name__ == "__main__":
    main(sys.argv[1:])
