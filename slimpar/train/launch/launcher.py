"""Start a training job: in this process, under an existing torchrun group, or as local workers (CPU or GPU)
through torch's own elastic launcher (the machinery behind torchrun).

Resuming is the default: a run folder that holds a complete checkpoint continues from it
(``checkpoint.resume``, see :mod:`slimpar.train.trainer`); ``--fresh`` deletes the old run's outputs
(:data:`FRESH_DELETES`) and starts over. With ``parallel.max_restarts`` N (``slimpar train
--max-restarts N``) the elastic agent restarts all workers after a failure, up to N times, and each
restart resumes from the newest complete checkpoint by itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

from slimpar.config import Config, from_dict, to_dict, to_toml
from slimpar.train.checkpoint.init_from import INIT_FROM_RECORD, record_init_from
from slimpar.train.job import parent, preempt
from slimpar.train.job.elastic import MEMBERSHIP, restart_count, under_torchrun
from slimpar.train.launch import failure, local_rdzv, oom
from slimpar.train.launch.run_lock import run_lock
from slimpar.train.launch.worker import worker_main
from slimpar.train.validate.limits import runs_in_process
from slimpar.utils import write_text_atomic

# what --fresh removes from the run folder (only these; config.toml is rewritten, tokenizer files are kept)
FRESH_DELETES = ("checkpoints", "metrics.jsonl", "summary.json", "model.safetensors", "manifest.json", "eval.json",
                 INIT_FROM_RECORD, "tensorboard", "mlruns", MEMBERSHIP)

SHUTDOWN_MARGIN_S = 15  # the agent's wait for stopped workers beyond checkpoint.on_signal_s


def run_name(config_name: str, cfg: Config | None = None) -> str:
    """What a run folder is named after: the config (not ``default``, which says nothing) and, for the
    user's own data (``data.corpus = "path"``), the data file or folder: ``mytext`` for the default config
    on ``mytext.txt``, ``llama_small-mytext`` for ``--config llama_small``."""
    parts = [Path(config_name).stem]
    if cfg is not None and cfg.data.kind == "text" and cfg.data.corpus == "path" and cfg.data.path:
        data = Path(cfg.data.path).expanduser().resolve()
        stem = data.stem if data.is_file() else data.name
        parts = [p for p in parts if p != "default"] + [re.sub(r"[^A-Za-z0-9._-]+", "_", stem) or "data"]
    return "-".join(parts)


def default_run_folder(config_name: str, cfg: Config | None = None) -> Path:
    """``runs/<name>`` (:func:`run_name`), the folder of a run started without ``--out``.

    No time stamp: the same command run again finds the same folder and resumes the run from its newest
    checkpoint (its settings checked against the folder's ``config.toml``, :mod:`slimpar.train.launch.rerun`);
    ``--fresh`` starts over there. Under torchrun every rank computes the same name, so they share one folder.
    """
    return Path("runs") / run_name(config_name, cfg)


def prepare_out_dir(cfg: Config, out_dir: Path) -> None:
    """Create the run folder and write the resolved config (rank 0 / the launching process only).

    A fresh start (``checkpoint.resume = false``: ``slimpar train --fresh``) deletes :data:`FRESH_DELETES`
    first, so that no old checkpoint outlives it, but never in a restarted worker: a job restarted by the
    elastic agent continues the run it started. ``metrics.jsonl`` is not touched otherwise: the trainer
    truncates it to the step it resumes from (0 without a checkpoint). With ``model.init_from``, the first
    start records the folder's sha256 (:mod:`slimpar.train.checkpoint.init_from`), which later starts check.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if restart_count() == 0:  # a new invocation: the user may have fixed what failed for good
        failure.clear(out_dir)
        preempt.clear_record(out_dir)
    if not cfg.checkpoint.resume and restart_count() == 0:
        for name in FRESH_DELETES:
            path = out_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    write_text_atomic(out_dir / "config.toml", to_toml(cfg))  # other ranks may be reading it (rerun.py)
    record_init_from(cfg, out_dir)  # at the first start only: the sha256 of the files the run starts from


def launch(cfg: Config, out_dir: Path) -> None:
    """Run ``cfg`` with ``parallel.workers`` processes and write outputs to ``out_dir``.

    ``sdp.memory_budget`` is resolved first, here, before any process group exists (the prediction joins a
    fake one of its own): the workers run the chosen keeps (slimpar.train.memory.budget)."""
    from slimpar.train.memory.budget import resolve_memory_budget
    from slimpar.train.memory.budget_record import write_record
    from slimpar.train.memory.floor_check import check_predicted_floor

    run, budget = resolve_memory_budget(cfg)  # ConfigError (exit 2) before anything is written
    check_predicted_floor(run)  # near the edge of the memory: the prediction of plan --memory (exit 2)
    if under_torchrun() and int(os.environ.get("RANK", "0")) != 0:
        worker_main(to_dict(run), str(out_dir))
        return
    with run_lock(out_dir):  # RunFolderInUse (exit 2) where another job writes the folder, before any write
        prepare_out_dir(cfg, out_dir)
        write_record(out_dir, budget)
        if under_torchrun() or runs_in_process(run):
            worker_main(to_dict(run), str(out_dir))
            return
        _elastic(run, out_dir)


def _elastic(cfg: Config, out_dir: Path) -> None:
    """The workers under torch's elastic agent, with slimpar's restarts around it.

    The agent runs with ``max_restarts = 0``; restarts happen here, ``parallel.max_restarts`` times at most,
    each from the newest checkpoint: after a failure that :mod:`slimpar.train.launch.failure` recorded as certain to
    recur (the NaN guard, an input error, a full disk) the job ends with that message instead."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    # workers share the machine's cores instead of each starting a full thread pool
    # glibc returns freed blocks to the OS only above this size: RSS peaks then track live tensors (env.md)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([_package_root(), *(p for p in paths if p != _package_root())])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.parallel.workers)))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host: gloo's sockets on the loopback
    os.environ[parent.LAUNCHER_PID] = str(os.getpid())  # the workers die with this process (parent.py)
    cfg = _grace_within_agent_wait(cfg)
    restarts = cfg.parallel.max_restarts
    with _quiet_agent():
        for attempt in range(restarts + 1):
            ooms = oom.oom_kill_count()
            try:
                _agent_run(cfg, out_dir)
                return
            except ChildFailedError as e:
                if preempt.read_record(out_dir) is not None and preempt.stopped_themselves(e.failures):
                    raise  # a stop signal reached the workers only: not a failure, not restarted
                e.oom_ranks = oom.oom_killed(oom.sigkilled(e.failures), ooms)  # read by describe_failure
                if e.oom_ranks:
                    from slimpar.train.validate.memory_floor import machine_text

                    print(oom.oom_message(e.oom_ranks, machine_text(cfg)), file=sys.stderr, flush=True)
                    raise
                recorded = failure.read(out_dir)
                if recorded is not None and restarts:
                    print(failure.not_retried(recorded[0]), file=sys.stderr, flush=True)  # its paragraph is above
                if recorded is not None or attempt == restarts:
                    raise
                print(f"slimpar: {describe_failure(e)}; restarting every worker from the newest checkpoint "
                      f"(restart {attempt + 1} of {restarts})", file=sys.stderr, flush=True)
                tree = to_dict(cfg)
                cfg = from_dict({**tree, "checkpoint": {**tree["checkpoint"], "resume": True}})


def _grace_within_agent_wait(cfg: Config) -> Config:
    """``cfg`` whose ``checkpoint.on_signal_s`` ends before torch's elastic agent stops waiting for the workers.

    A torch without ``LaunchConfig.shutdown_timeout`` (before 2.12: parallel/compat.py) waits a fixed 30 s and
    then SIGKILLs the workers; their grace is shortened to end ``SHUTDOWN_MARGIN_S`` before that, so a stop
    still ends with each worker's own closing line (saved, or out of time after the grace it really had). Not
    said at launch: on such a torch every run would print it (docs/training.md, "Which torch", says it once)."""
    from slimpar.parallel.compat import agent_shutdown_s

    wanted = math.ceil(cfg.checkpoint.on_signal_s) + SHUTDOWN_MARGIN_S
    wait = agent_shutdown_s(wanted)
    if wait >= wanted:
        return cfg
    tree = to_dict(cfg)
    grace = float(max(wait - SHUTDOWN_MARGIN_S, 1))
    return from_dict({**tree, "checkpoint": {**tree["checkpoint"], "on_signal_s": grace}})


def _agent_run(cfg: Config, out_dir: Path) -> None:
    """One start of every worker under torch's elastic agent (a c10d rendezvous on this host)."""
    from torch.distributed.launcher.api import elastic_launch

    from slimpar.parallel.compat import launch_config

    wait = math.ceil(cfg.checkpoint.on_signal_s) + SHUTDOWN_MARGIN_S
    lc = launch_config(wait, min_nodes=1, max_nodes=1, nproc_per_node=cfg.parallel.workers,
                      run_id=f"slimpar-{uuid.uuid4().hex[:8]}", rdzv_backend=local_rdzv.register(),
                      rdzv_endpoint=f"{local_rdzv.LOOPBACK}:0", local_addr=local_rdzv.LOOPBACK, max_restarts=0,
                      monitor_interval=0.1,  # every socket of the job on the loopback (local_rdzv.py)
                      # the agent forwards a stop signal to the workers and waits for their save (preempt.py):
                      # longer than their own grace timer, after which it would SIGKILL them
                      signals_to_handle="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")
    # each worker runs ``python -m slimpar.train.launch.worker_entry`` (why: worker_entry.py) with this slimpar
    entry = "slimpar.train.launch.worker_entry"
    elastic_launch(lc, sys.executable)("-m", entry, json.dumps(to_dict(cfg)), str(out_dir))


def describe_failure(e: BaseException) -> str:
    """'rank 1 exited with code 1' (or 'was killed by SIGKILL') for the worker that failed first: the root cause,
    not the others that then failed with it.

    The agent stamps a failure without an error file in whole seconds, so a worker killed by a signal and the
    survivor that then exited with code 1 ("lost a peer") often share a time stamp, and the earliest-stamp rule
    (``get_first_failure``) alone named the survivor. The cause is taken in this order: a worker killed by a signal
    other than the SIGTERM that the agent sends the others, then one that exited with an error code other than
    143 (a survivor that took that SIGTERM as a stop request: preempt.py), then any; within each, the earliest.
    A worker that ``_elastic`` found killed by the kernel's out-of-memory killer (``e.oom_ranks``) comes first."""
    import signal

    failures = getattr(e, "failures", None)
    if not failures:
        return "a worker failed"
    oom_ranks = getattr(e, "oom_ranks", ())

    def cause(item: tuple[int, object]) -> tuple[int, float, int]:
        rank, f = item
        closed = f.exitcode in (-signal.SIGTERM, preempt.EXIT_CODE)
        order = 0 if f.exitcode < 0 and not closed else 1 if f.exitcode > 0 and not closed else 2
        order = -1 if rank in oom_ranks else order  # the kernel's out-of-memory kill first (oom.py)
        return order, f.timestamp, rank

    rank, f = min(failures.items(), key=cause)
    code = f.exitcode
    if rank in oom_ranks:
        return f"rank {rank} was killed by the kernel's out-of-memory killer (SIGKILL)"
    if code < 0:
        try:
            return f"rank {rank} was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"rank {rank} was killed by signal {-code}"
    return f"rank {rank} exited with code {code}"


_AGENT_LOGGERS = ("agent.server.api", "agent.server.local_elastic_agent", "multiprocessing.api",
                  "rendezvous.dynamic_rendezvous", "rendezvous.c10d_rendezvous_backend")


@contextlib.contextmanager
def _quiet_agent() -> Iterator[None]:
    """Silence the elastic agent's own log lines while it runs (Ctrl-C's "Received 2 death signal", "Sending
    process N closing signal SIGTERM", "failed (exitcode: 1)"): slimpar says what failed, once, in its own words:
    the worker's paragraph, then :func:`describe_failure` or the CLI's closing line."""
    loggers = [logging.getLogger(f"torch.distributed.elastic.{name}") for name in _AGENT_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _package_root() -> str:
    """The folder that holds this ``slimpar`` package: the workers import the same copy as the launcher."""
    return str(Path(__file__).resolve().parents[3])
