"""Helpers for tests that run ``slimpar`` in subprocesses (local gloo workers) with hard timeouts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "llama_tiny.toml"


def spawn_gloo(worker, nprocs: int, tmp_path: Path) -> list[str]:
    """Runs ``worker(rank, init, out)`` in ``nprocs`` spawned processes (``init``: a file store for a gloo
    group; ``out``: a path prefix each rank writes ``{out}.{rank}`` to) and returns what each rank wrote."""
    import torch.multiprocessing as mp

    out = tmp_path / "out"
    mp.start_processes(worker, args=(f"file://{tmp_path / 'store'}", str(out)), nprocs=nprocs, start_method="spawn")
    return [Path(f"{out}.{rank}").read_text() for rank in range(nprocs)]


@contextlib.contextmanager
def background_run(cmd: list[str], cwd: Path, kill_after: float = 240) -> Iterator[subprocess.Popen]:
    """``cmd`` in a session of its own (a signal to its process group reaches every process, as a terminal's
    Ctrl-C does), its output piped as text, SIGKILLed after ``kill_after`` seconds whatever the test does."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    guard = threading.Timer(kill_after, lambda: os.killpg(proc.pid, signal.SIGKILL))
    guard.start()
    try:
        yield proc
    finally:
        guard.cancel()


def run_train(out: Path, *overrides: str, config: Path = TINY, timeout: int = 240, resume: bool = False,
              check: bool = True) -> subprocess.CompletedProcess:
    """``slimpar train`` in a fresh interpreter; fails the test with the output on error or time-out."""
    cmd = [sys.executable, "-m", "slimpar", "train", "--config", str(config), "--out", str(out), *overrides]
    if resume:
        cmd.append("--resume")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def losses(out: Path) -> list[float]:
    """The logged training losses (lines of another ``kind``, such as a membership change, have none)."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "kind" not in r]


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def stop_and_resume(out: Path, first: list[str], then: list[str], stop_after: int = 1, timeout: int = 240) -> None:
    """``slimpar train`` with overrides ``first`` stopped (with its checkpoint) after ``stop_after`` steps, then
    ``--resume`` with ``then``; checks that the resume began there: the records before it stay as written
    (their wall times included), which a run that started over would have rewritten."""
    run_train(out, *first, "--train.stop_after", str(stop_after), timeout=timeout)
    assert len(losses(out)) == stop_after and not (out / "summary.json").exists()
    head = (out / "metrics.jsonl").read_text()
    run_train(out, *then, resume=True, timeout=timeout)
    assert (out / "metrics.jsonl").read_text().startswith(head)


def assert_same_run(got: Path, want: Path) -> None:
    """Two finished runs are the same to the bit: logged losses, validation loss and every exported weight."""
    import torch

    from slimpar.train.checkpoint.export import load_safetensors

    assert losses(got) == losses(want)
    assert summary(got)["val_loss"] == summary(want)["val_loss"]
    a, b = load_safetensors(got / "model.safetensors"), load_safetensors(want / "model.safetensors")
    assert set(a) == set(b)
    for k, v in b.items():
        assert torch.equal(a[k], v), k


# Virtual-pipeline unit tests: every stage in one process on the tiny LLaMA.
VIRTUAL_PIPELINE = ["--model.tie_embeddings", "false", "--parallel.mode", "pipeline", "--pipeline.virtual", "true",
                    "--train.batch_size", "8", "--pipeline.schedule", "gpipe", "--eval.batches", "1"]


def single_process_context():
    """The RunContext of a one-process run in the current folder (no process group)."""
    import torch

    from slimpar.train.job.context import RunContext

    return RunContext(0, 1, torch.device("cpu"), Path("."), None)


def batch_fn(data, cfg):
    """The trainer's batch function of a one-process run."""
    return lambda step, micro: data.train_batch(step, 0, 1, cfg.train.batch_size, cfg.data.seq_len)


class LazyRuns(dict):
    """name -> result, made on first use: a module's shared runs where some cases are marked ``slow``, so
    that the default suite never trains the runs only slow cases read."""

    def __init__(self, make):
        super().__init__()
        self._make = make

    def __missing__(self, key):
        value = self[key] = self._make(key)
        return value


def train_virtual_pipeline(cfg, data, steps: int):
    """A virtual pipeline strategy trained ``steps`` steps the way the trainer steps it (no lr schedule)."""
    from slimpar.train.build import build_model
    from slimpar.train.run_plan import run_plan
    from slimpar.train.strategies.pipeline import VirtualPipelineStrategy

    run = run_plan(cfg, data.vocab_size)
    strat = VirtualPipelineStrategy(cfg, build_model(cfg, data), single_process_context(), run)
    opt = strat.build_optimizer(cfg)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        strat.train_step(step, batch_fn(data, cfg))
        strat.after_backward()
        opt.step()
        strat.after_step()
    return strat


def standin_gpus(monkeypatch, gpus: int, memory: int = 80 << 30) -> None:
    """This machine seen as one with ``gpus`` CUDA devices of ``memory`` bytes and NCCL (what start-up reads: the
    device choice, the GPU count, the memory floor, NCCL's availability); nothing runs on them."""
    import types

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=memory))
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
