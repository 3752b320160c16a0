"""``parallel.device = "auto"`` (the default): CUDA with NCCL where each local worker gets a GPU, the CPU with gloo
otherwise; fewer GPUs than workers falls back to the CPU with a note, never in silence; an explicit device wins.
The rule is a pure function of the counts (slimpar.parallel.placement.choose_device); the stand-in GPUs of
tests/helpers.standin_gpus check what start-up makes of it (slimpar.train.validate.device)."""

from __future__ import annotations

import pytest
import torch

from slimpar.config import ConfigError
from slimpar.parallel.placement import choose_device
from slimpar.train.validate.checks import load_run_config
from tests.helpers import TINY, standin_gpus

DDP4 = ["--parallel.mode", "ddp", "--parallel.workers", "4"]


def _pair(device: str, backend: str, gpus: int, local: int) -> tuple[str, str]:
    choice = choose_device(device, backend, gpus, local)
    return choice.device, choice.backend


@pytest.fixture(autouse=True)
def _alone(monkeypatch):
    """Not under torchrun or srun: the workers of slimpar's launcher all run on this machine."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE",
                 "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_auto_is_the_cpu_and_gloo_without_cuda():
    cfg = load_run_config(TINY, DDP4, training=False)
    assert (cfg.parallel.device, cfg.parallel.backend) == ("cpu", "gloo")


@pytest.mark.parametrize("gpus, local, want", [
    (0, 4, ("cpu", "gloo")),
    (4, 4, ("cuda", "nccl")),
    (8, 4, ("cuda", "nccl")),
    (1, 1, ("cuda", "nccl")),
])
def test_auto_takes_cuda_where_every_worker_gets_a_gpu(gpus, local, want):
    choice = choose_device("auto", "auto", gpus, local)
    assert (choice.device, choice.backend) == want and choice.note == ""


def test_fewer_gpus_than_workers_falls_back_to_the_cpu_and_says_so():
    choice = choose_device("auto", "auto", 1, 4)
    assert (choice.device, choice.backend) == ("cpu", "gloo")
    for part in ("1 GPU here for 4 local workers", "training on the CPU",
                 "--parallel.device cuda --parallel.backend gloo", "--parallel.workers 1", "--nproc_per_node 1"):
        assert part in choice.note, (part, choice.note)


def test_an_explicit_backend_decides_for_too_few_gpus():
    """gloo shares the GPUs (parallel.placement.gpu_index); nccl takes CUDA, and the validator counts the GPUs."""
    assert _pair("auto", "gloo", 1, 4) == ("cuda", "gloo")
    assert _pair("auto", "nccl", 1, 4) == ("cuda", "nccl")
    assert _pair("auto", "nccl", 0, 4) == ("cpu", "nccl")  # check_backend refuses it: no GPU here


def test_an_explicit_device_wins():
    assert _pair("cpu", "auto", 8, 1) == ("cpu", "gloo")
    assert _pair("cuda", "auto", 0, 4) == ("cuda", "nccl")  # the validator refuses it: 0 GPUs


def test_standin_gpus_resolve_to_cuda_and_nccl(monkeypatch):
    standin_gpus(monkeypatch, 4)
    cfg = load_run_config(TINY, DDP4, training=False)
    assert (cfg.parallel.device, cfg.parallel.backend) == ("cuda", "nccl")
    cfg = load_run_config(TINY, [], training=False)  # one process in-process: one GPU is enough
    assert cfg.parallel.device == "cuda"


def test_standin_gpus_too_few_fall_back_to_the_cpu(monkeypatch):
    standin_gpus(monkeypatch, 2)
    cfg = load_run_config(TINY, DDP4, training=False)
    assert (cfg.parallel.device, cfg.parallel.backend) == ("cpu", "gloo")
    cfg = load_run_config(TINY, [*DDP4, "--parallel.backend", "gloo"], training=False)  # 4 workers share 2 GPUs
    assert (cfg.parallel.device, cfg.parallel.backend) == ("cuda", "gloo")
    with pytest.raises(ConfigError, match="runs 4 worker process.* it has 2 GPUs"):
        load_run_config(TINY, [*DDP4, "--parallel.backend", "nccl"], training=False)


def test_standin_gpus_count_this_nodes_workers_under_torchrun(monkeypatch):
    """Two nodes of 2 GPUs, torchrun --nproc_per_node 2: each node's 2 workers get a GPU each."""
    standin_gpus(monkeypatch, 2)
    for k, v in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    assert load_run_config(TINY, DDP4, training=False).parallel.device == "cuda"


def test_an_explicit_cpu_wins_over_standin_gpus(monkeypatch):
    standin_gpus(monkeypatch, 8)
    cfg = load_run_config(TINY, [*DDP4, "--parallel.device", "cpu"], training=False)
    assert (cfg.parallel.device, cfg.parallel.backend) == ("cpu", "gloo")


def test_a_pipeline_on_gpus_over_gloo_is_refused_before_it_starts(monkeypatch):
    """gloo sends from host memory only (the H200's 4 cuda:gloo SDP ranks: "writev: Bad address"): SDP's sends go
    through the host (parallel/device.send), a pipeline's stages need NCCL; all its stages in one process need none."""
    standin_gpus(monkeypatch, 1)
    pipe = ["--parallel.mode", "pipeline", "--pipeline.stages", "2", "--parallel.workers", "2",
            "--parallel.backend", "gloo"]
    with pytest.raises(ConfigError, match="gloo does from host memory only"):
        load_run_config(TINY, pipe, training=False)
    cfg = load_run_config(TINY, [*pipe[:-4], "--parallel.backend", "gloo", "--pipeline.virtual", "true"],
                          training=False)
    assert cfg.parallel.device == "cuda"


def test_nccl_on_a_machine_without_gpus_names_the_fix():
    with pytest.raises(ConfigError, match="runs on GPUs.*--parallel.backend gloo"):
        load_run_config(TINY, [*DDP4, "--parallel.backend", "nccl"], training=False)


def test_the_start_line_says_device_backend_and_dtype(monkeypatch):
    from slimpar.config import load_config
    from slimpar.train.validate.device import resolve_device, start_line

    standin_gpus(monkeypatch, 4)
    cfg = load_config(TINY, [*DDP4, "--train.dtype", "bf16"])
    assert start_line(cfg, resolve_device(cfg)) == "slimpar: device cuda (1 GPU per worker), backend nccl, dtype bf16"
    cfg = load_config(TINY, [*DDP4, "--parallel.backend", "gloo"])
    standin_gpus(monkeypatch, 1)
    shared = "slimpar: device cuda (4 workers share 1 GPU), backend gloo, dtype fp32"
    assert start_line(cfg, resolve_device(cfg)) == shared
    cfg = load_config(TINY, [])
    alone = "slimpar: device cuda (1 GPU per worker), backend none (one process), dtype fp32"
    assert start_line(cfg, resolve_device(cfg)) == alone


def test_validation_and_workers_refuse_an_unresolved_auto(tmp_path):
    """``auto`` is resolved once, at start-up; a path that skipped it must not train on the CPU unasked."""
    from slimpar.config import load_config
    from slimpar.train.job.context import init_context
    from slimpar.train.validate.checks import validate

    cfg = load_config(TINY, [])
    with pytest.raises(ValueError, match="resolve_device"):
        validate(cfg)
    with pytest.raises(ValueError, match="resolve_device"):
        init_context(cfg, tmp_path)


def test_a_resumed_auto_run_on_another_machine_is_the_same_run():
    """config.toml records the resolved device; the resume resolves again, and the device is not a run's setting."""
    from slimpar.config import load_config
    from slimpar.train.launch.rerun import config_changes

    gpu = load_config(TINY, ["--parallel.device", "cuda", "--parallel.backend", "nccl"])
    cpu = load_config(TINY, ["--parallel.device", "cpu", "--parallel.backend", "gloo"])
    assert config_changes(gpu, cpu) == ([], [])
