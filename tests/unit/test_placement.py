"""Where a worker sits on its machine (slimpar.parallel.placement): its GPU comes from LOCAL_RANK, or SLURM_LOCALID
under a bare srun, never the global RANK; start-up validation counts the GPUs this machine's workers need
(LOCAL_WORLD_SIZE, or srun's tasks on this node), not the job's WORLD_SIZE. On 1586a30 a bare srun put every rank
on GPU 0 and a two-node CUDA job was refused (tests marked "failed on 1586a30")."""

from __future__ import annotations

import pytest
import torch

from slimpar.config import ConfigError
from tests.helpers import TINY, standin_gpus

JOB_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_LOCALID", "SLURM_NODEID",
            "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "MASTER_ADDR")


@pytest.fixture
def env(monkeypatch):
    """A clean job environment; returns a setter."""
    for name in JOB_VARS:
        monkeypatch.delenv(name, raising=False)
    return lambda **kv: [monkeypatch.setenv(k, str(v)) for k, v in kv.items()]


def test_local_rank_from_torchrun_or_srun(env):
    from slimpar.parallel.placement import local_rank

    assert local_rank() == 0  # one process
    env(SLURM_LOCALID=3)
    assert local_rank() == 3  # a bare srun: the task's index on its node
    env(LOCAL_RANK=1)
    assert local_rank() == 1  # torchrun (inside srun too) says it directly


def test_local_world_size_from_torchrun_or_srun(env):
    from slimpar.parallel.placement import local_world_size

    assert local_world_size(default=8) == 8  # slimpar's launcher: every worker here
    env(SLURM_LOCALID=0, SLURM_NODEID=3, SLURM_TASKS_PER_NODE="4(x3),2")
    assert local_world_size(default=8) == 2
    env(SLURM_STEP_TASKS_PER_NODE="4(x4)")  # the step's own list wins over the job's
    assert local_world_size(default=8) == 4
    env(LOCAL_WORLD_SIZE=3)
    assert local_world_size(default=8) == 3


def test_slurm_tasks_per_node_lists():
    from slimpar.parallel.placement import slurm_tasks_on_node

    assert [slurm_tasks_on_node("2(x3),1", n) for n in range(4)] == [2, 2, 2, 1]
    assert slurm_tasks_on_node("8", 0) == 8
    with pytest.raises(ValueError, match="lists 4 node"):
        slurm_tasks_on_node("2(x3),1", 4)
    with pytest.raises(ValueError, match="cannot read"):
        slurm_tasks_on_node("2(x)", 0)


def test_a_bare_srun_rank_drives_its_own_gpu(env, monkeypatch, tmp_path):
    """Failed on 1586a30: LOCAL_RANK defaulted to 0, so every task of a node took GPU 0."""
    from slimpar.train.job.context import init_context
    from slimpar.train.validate.checks import load_run_config

    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    env(RANK=6, WORLD_SIZE=8, SLURM_LOCALID=2, SLURM_NODEID=1, SLURM_STEP_TASKS_PER_NODE="4(x2)")
    cfg = load_run_config(str(TINY), ["--parallel.device", "cpu"], training=False)
    cfg.parallel.device, cfg.parallel.backend = "cuda", "nccl"  # as a GPU machine resolves: the context picks one
    ctx = init_context(cfg, tmp_path)  # no MASTER_ADDR: no process group is created
    assert ctx.device == torch.device("cuda", 2) and chosen == [torch.device("cuda", 2)]


def _validate_cuda(gpus: int, monkeypatch, workers: int = 8, backend: str = "nccl") -> None:
    from slimpar.train.validate.checks import load_run_config

    standin_gpus(monkeypatch, gpus)  # this CPU build has no CUDA and no NCCL
    load_run_config(str(TINY), ["--parallel.device", "cuda", "--parallel.backend", backend, "--parallel.mode", "ddp",
                                "--parallel.workers", str(workers)], training=False)


def test_two_nodes_of_four_gpus_pass_validation(env, monkeypatch):
    """Failed on 1586a30: 8 workers were compared with the 4 GPUs of one node."""
    env(RANK=5, WORLD_SIZE=8, LOCAL_RANK=1, LOCAL_WORLD_SIZE=4)
    _validate_cuda(4, monkeypatch)
    env(LOCAL_WORLD_SIZE=5)
    with pytest.raises(ConfigError, match="runs 5 worker process.* it has 4 GPUs"):
        _validate_cuda(4, monkeypatch)


def test_a_bare_srun_job_passes_validation(env, monkeypatch):
    """Failed on 1586a30: srun gives no LOCAL_WORLD_SIZE; its tasks on this node are what needs GPUs."""
    env(RANK=1, WORLD_SIZE=8, SLURM_LOCALID=1, SLURM_NODEID=0, SLURM_STEP_TASKS_PER_NODE="4(x2)")
    _validate_cuda(4, monkeypatch)


def test_slimpars_launcher_still_needs_a_gpu_per_worker(env, monkeypatch):
    """Without torchrun or srun every worker runs on this machine."""
    with pytest.raises(ConfigError, match="runs 8 worker process.* it has 4 GPUs"):
        _validate_cuda(4, monkeypatch)
    _validate_cuda(8, monkeypatch)


def test_gloo_ranks_share_the_gpus_in_turn(env, monkeypatch, tmp_path):
    """gloo reduces CUDA tensors too and, unlike NCCL, takes several ranks on one GPU: 4 workers on 1 GPU pass
    validation and all drive cuda:0 (the device check's cuda:gloo row); NCCL still needs a GPU each."""
    from slimpar.parallel.placement import gpu_index
    from slimpar.train.job.context import init_context
    from slimpar.train.validate.checks import load_run_config

    assert [gpu_index(r, 1, "gloo") for r in range(4)] == [0, 0, 0, 0]
    assert [gpu_index(r, 2, "gloo") for r in range(4)] == [0, 1, 0, 1]
    assert [gpu_index(r, 4, "nccl") for r in range(4)] == [0, 1, 2, 3]
    _validate_cuda(1, monkeypatch, workers=4, backend="gloo")
    with pytest.raises(ConfigError, match="runs 4 worker process.* it has 1 GPUs"):
        _validate_cuda(1, monkeypatch, workers=4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    env(RANK=3, WORLD_SIZE=4, LOCAL_RANK=3, LOCAL_WORLD_SIZE=4)
    cfg = load_run_config(str(TINY), ["--parallel.device", "cpu", "--parallel.backend", "gloo"], training=False)
    cfg.parallel.device = "cuda"
    assert init_context(cfg, tmp_path).device == torch.device("cuda", 0)


def test_a_restarted_gloo_group_binds_the_gpu_the_context_binds(env, monkeypatch):
    """Under an elastic agent's store (slimpar's launcher, torchrun) the group is made by init_attempt_group, which
    bound cuda:LOCAL_RANK: a GPU that does not exist for the 4th gloo worker sharing one GPU (the device check's
    cuda:gloo row). It binds the GPU init_context drives now."""
    from slimpar.train.launch import worker
    from slimpar.train.validate.checks import load_run_config

    standin_gpus(monkeypatch, 1)
    chosen, groups = [], []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(worker.dist, "TCPStore", lambda *a, **k: "store")
    monkeypatch.setattr(worker.dist, "PrefixStore", lambda prefix, store: store)
    monkeypatch.setattr(worker.dist, "init_process_group", lambda backend, **kw: groups.append((backend, kw)))
    env(RANK=3, WORLD_SIZE=4, LOCAL_RANK=3, LOCAL_WORLD_SIZE=4, MASTER_ADDR="127.0.0.1", MASTER_PORT=29500,
        TORCHELASTIC_USE_AGENT_STORE="True")
    cfg = load_run_config(str(TINY), ["--parallel.mode", "ddp", "--parallel.workers", "4", "--parallel.backend",
                                      "gloo"], training=False)
    assert cfg.parallel.device == "cuda"  # auto with an explicit gloo: the workers share the GPU
    worker.init_attempt_group(cfg)
    (backend, kw), = groups
    # the gloo group binds no device (its ranks share one GPU: job/context.nccl_device_id)
    assert chosen == [torch.device("cuda", 0)] and backend == "gloo" and kw["device_id"] is None
