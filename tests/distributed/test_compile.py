"""``train.compile``: every mode's compiled run equals its eager run in loss, and blocks compiled one by one keep
SDP's bucketed averaging overlapped with backward (a whole-model graph would launch every bucket at its end).

The default suite compiles with ``aot_eager`` (dynamo's graph capture and AOTAutograd's joint graph, run by
eager kernels: what changes the hooks, the overlap and the graph breaks); the ``slow`` cases use inductor."""

import json

import pytest
import torch

from slimpar.train.job.context import RunContext
from slimpar.train.trainer import Trainer
from slimpar.train.validate.checks import load_run_config
from tests.helpers import TINY, VIRTUAL_PIPELINE, losses, run_train, spawn_gloo

STEPS = ["--train.steps", "3", "--log.every", "1", "--eval.batches", "1", "--data.ood", "none",
         "--checkpoint.export", "false", "--checkpoint.final", "false"]
VIRTUAL_SDP = ["--parallel.mode", "sdp", "--sdp.virtual", "true", "--sdp.virtual_workers", "4"]
ONE_PROCESS = {
    "single": [],
    "virtual B-SDP": VIRTUAL_SDP,
    "virtual Nb-SDP": [*VIRTUAL_SDP, "--sdp.level", "neuron", "--sdp.regime", "backward"],
    "batched Bb-SDP": [*VIRTUAL_SDP, "--sdp.virtual_batched", "true", "--sdp.regime", "backward"],
    "virtual pipeline MAPL + RVQ": [*VIRTUAL_PIPELINE, "--pipeline.codec", "mapl", "--pipeline.rvq.levels", "2"],
    "virtual pipeline SSN": [*VIRTUAL_PIPELINE, "--pipeline.codec", "ssn"],
    "single, compile_scope loss": ["--train.compile_scope", "loss"],
    "single, compile_scope model": ["--train.compile_scope", "model"],
    "virtual B-SDP, compile_scope model": [*VIRTUAL_SDP, "--train.compile_scope", "model"],
    "batched Bb-SDP, compile_scope loss": [*VIRTUAL_SDP, "--sdp.virtual_batched", "true", "--sdp.regime", "backward",
                                           "--train.compile_scope", "loss"],
}
PROCESSES = {
    "DDP": ["--parallel.mode", "ddp", "--parallel.workers", "2"],
    "B-SDP": ["--parallel.mode", "sdp", "--parallel.workers", "2"],
    "DDP, compile_scope loss": ["--parallel.mode", "ddp", "--parallel.workers", "2", "--train.compile_scope", "loss"],
}
SLOW_PROCESSES = {
    "FSDP2": ["--parallel.mode", "fsdp", "--parallel.workers", "2"],
    "Bb-SDP": ["--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.regime", "backward"],
    "N-SDP": ["--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.level", "neuron"],
    "B-SDP + holder FSDP2": ["--parallel.mode", "sdp", "--parallel.workers", "4", "--sdp.keep", "0.5",
                             "--sdp.holder_shard", "true"],
    "pipeline MAPL": ["--parallel.mode", "pipeline", "--parallel.workers", "2", "--pipeline.stages", "2",
                      "--pipeline.codec", "mapl"],
    "pipeline x SDP": ["--parallel.mode", "pipeline", "--parallel.workers", "4", "--pipeline.stages", "2",
                       "--pipeline.dp", "sdp", "--pipeline.codec", "mapl"],
}


def _in_process(tmp_path, overrides: list[str]) -> list[float]:
    cfg = load_run_config(TINY, [*STEPS, *overrides])
    tmp_path.mkdir(parents=True)
    Trainer(cfg, RunContext(0, 1, torch.device("cpu"), tmp_path, None)).run()
    return losses(tmp_path)


def _assert_equal_losses(eager: list[float], compiled: list[float]) -> None:
    assert len(eager) == len(compiled) == 3
    assert max(abs(a - b) for a, b in zip(eager, compiled, strict=True)) <= 1e-5, (eager, compiled)


@pytest.mark.parametrize("mode", list(ONE_PROCESS))
def test_compiled_equals_eager_in_one_process(tmp_path, mode):
    eager = _in_process(tmp_path / "eager", ONE_PROCESS[mode])
    compiled = _in_process(tmp_path / "compiled", [*ONE_PROCESS[mode], "--train.compile", "true",
                                                   "--train.compile_backend", "aot_eager"])
    _assert_equal_losses(eager, compiled)


def _processes(tmp_path, overrides: list[str], backend: str) -> tuple[list[float], list[float]]:
    run_train(tmp_path / "eager", *STEPS, *overrides)
    run_train(tmp_path / "compiled", *STEPS, *overrides, "--train.compile", "true", "--train.compile_backend",
              backend, timeout=600)
    return losses(tmp_path / "eager"), losses(tmp_path / "compiled")


# DDP across processes in -m slow (its model compiles as in "single"; B-SDP holds the cross-process hooks)
@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.slow) if m == "DDP" else m
                                  for m in PROCESSES])
def test_compiled_equals_eager_across_processes(tmp_path, mode):
    _assert_equal_losses(*_processes(tmp_path, PROCESSES[mode], "aot_eager"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(SLOW_PROCESSES))
def test_compiled_equals_eager_in_the_other_modes(tmp_path, mode):
    _assert_equal_losses(*_processes(tmp_path, SLOW_PROCESSES[mode], "aot_eager"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", [*ONE_PROCESS, *PROCESSES, *SLOW_PROCESSES])
def test_inductor_equals_eager_in_every_mode(tmp_path, mode):
    overrides = {**ONE_PROCESS, **PROCESSES, **SLOW_PROCESSES}[mode]
    _assert_equal_losses(*_processes(tmp_path, overrides, "inductor"))


def _launch_points(rank: int, init: str, out: str) -> None:
    """Rank ``rank`` of 2: one SDP step on a small LLaMA (every worker holds every block, so every block is
    averaged) in three forms; writes, per form, when each bucket was launched as a share of backward's time."""
    import time

    import torch.distributed as dist

    from slimpar import SubnetworkDataParallel
    from slimpar.models import Llama, LlamaConfig
    from slimpar.parallel.compile import apply_compile
    from slimpar.sdp import plan_blocks
    from slimpar.sdp.sync import GradSync

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    launches: list[float] = []
    launch = GradSync._launch

    def spy(self, bucket):
        launches.append(time.perf_counter())
        return launch(self, bucket)

    GradSync._launch = spy
    result = {}
    for form in ("eager", "blocks", "whole"):
        torch.manual_seed(0)
        model = Llama(LlamaConfig(vocab_size=256, dim=128, n_layers=6, n_heads=4, n_kv_heads=2, ffn_dim=384))
        if form == "blocks":
            apply_compile(model.layers, "aot_eager")
        sdp = SubnetworkDataParallel(model, plan_blocks(model, 2, keep=1.0), bucket_mb=0.5)
        step = torch.compile(sdp, backend="aot_eager") if form == "whole" else sdp
        x = torch.randint(0, 256, (8, 128), generator=torch.Generator().manual_seed(rank))
        for _ in range(2):  # the first step compiles; the second is measured
            launches.clear()
            loss = step(x).float().logsumexp(-1).mean()
            t0 = time.perf_counter()
            loss.backward()
            t1 = time.perf_counter()
            sdp.sync()
            sdp.zero_grad(set_to_none=True)
        result[form] = [(t - t0) / (t1 - t0) for t in launches]
    dist.barrier()
    dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


def test_blocks_compiled_one_by_one_keep_the_buckets_overlapped(tmp_path):
    """Measured here: the first of 9 buckets leaves at 0.15-0.2 of backward eager and compiled per block, and at
    0.97 with one whole-model graph (0.97-0.99 with two copies of this test at once). The batch is 8 x 128: at
    4 x 128 the launches after the first took up to 14% of a whole-graph backward, and the control once read 0.844
    on a loaded machine."""
    for text in spawn_gloo(_launch_points, 2, tmp_path):
        points = json.loads(text)
        assert len(points["eager"]) >= 4 and len(points["blocks"]) == len(points["whole"]) == len(points["eager"])
        assert points["eager"][0] < 0.6 and points["blocks"][0] < 0.6  # launched while backward still runs
        assert points["whole"][0] > 0.85  # the form the overlap test tells apart: all buckets wait for the end
