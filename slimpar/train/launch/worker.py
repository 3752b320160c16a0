"""The entry point of each worker process: join or create the process group, train, clean up.

Two failures end a worker with one clear paragraph instead of a deep traceback: a diverged run
(:class:`~slimpar.train.guard.TrainingDiverged`) and a collective that waited ``parallel.timeout_s`` for a
peer that never came (a hung, stopped or dead worker). Either way the process exits non-zero, so the
launcher (slimpar's or torchrun) ends the whole job instead of leaving it hanging.
"""

from __future__ import annotations

import errno
import gc
import os
import signal
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from slimpar.config import Config, ConfigError, from_dict
from slimpar.data.errors import DataUnavailable
from slimpar.sdp.holders import ReplicaMismatch
from slimpar.train.guard import TrainingDiverged
from slimpar.train.job import parent, preempt
from slimpar.train.job.context import RunContext, init_context, nccl_device_id, worker_device
from slimpar.train.job.elastic import restart_count
from slimpar.train.launch import failure
from slimpar.train.launch.run_lock import hold_worker_lock
from slimpar.train.modes import mode_of


def worker_main(cfg_dict: dict, out_dir: str) -> None:
    """Run one worker of a training job (called by the launcher in every process).

    After a restart by the elastic agent (slimpar's ``--max-restarts`` or torchrun's) the worker always
    resumes from the newest complete checkpoint, even when the job was started with ``--fresh``.
    """
    cfg = from_dict(cfg_dict)
    previous = _quiet_ctrl_c()
    main = int(os.environ.get("RANK", "0")) == 0
    stop = preempt.StopRequest(cfg.checkpoint.on_signal_s, Path(out_dir), main)
    stop.install()  # SIGTERM / SIGUSR1: save at the step boundary and exit 143 (preempt.py)
    if "RANK" in os.environ:  # a worker of a launcher: the run folder stays locked until this process has exited
        hold_worker_lock(Path(out_dir))
    try:
        _run(cfg, out_dir, stop)
    except preempt.Preempted as e:  # before the training loop: nothing of this invocation to save
        if main:
            record = {"signal": str(e), "before_training": True, "newest": preempt.newest_step(Path(out_dir))}
            preempt.write_record(Path(out_dir), record)
            _speak_if_alone(record, out_dir)
        raise SystemExit(preempt.EXIT_CODE) from None
    finally:  # an elastic worker that was interrupted keeps ignoring SIGINT until it has exited
        stop.uninstall()
        interrupted = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        if previous is not None and not (interrupted and "TORCHELASTIC_RUN_ID" in os.environ):
            signal.signal(signal.SIGINT, previous)


def _quiet_ctrl_c():
    """Ctrl-C ends this worker once, quietly: the first SIGINT (the terminal's) raises KeyboardInterrupt, which
    :func:`_run` turns into exit 130; later ones (the elastic agent forwards its own) are ignored, so no
    traceback from Python's shutdown follows. Returns the previous handler (None off the main thread)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupted(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, interrupted)


def _speak_if_alone(record: dict, out_dir: str) -> None:
    """Rank 0 of slimpar's launcher prints a stop's closing line itself where the launcher is gone (killed: its
    death signal stopped this worker); otherwise the launching process prints it (preempt.py)."""
    if parent.launcher_pid() is not None and not parent.launcher_alive():
        again = os.environ.get(preempt.RESUME_ENV, "the same command")
        print(preempt.stop_message(record, again, Path(out_dir)), file=sys.stderr, flush=True)


def _run(cfg: Config, out_dir: str, stop: preempt.StopRequest) -> None:
    if restart_count() > 0:
        cfg.checkpoint.resume = True
        if (preempt.read_record(out_dir) or {}).get("saved"):  # torchrun's agent restarts stopped workers: stop
            raise SystemExit(preempt.EXIT_CODE)
        recorded = failure.read(out_dir)
        if recorded is not None:  # torchrun's agent restarts regardless: end at once (failure.py)
            if failure.first_to_say(out_dir, restart_count()):
                print(f"slimpar: error: {recorded[1]}\n{failure.not_retried(recorded[0])}", file=sys.stderr,
                      flush=True)
            raise SystemExit(recorded[2])
    init_attempt_group(cfg)
    ctx = init_context(cfg, Path(out_dir))
    # imported here: the launcher imports this module but trains only in-process runs, and the trainer's imports
    # (DCP, DTensor, the models) cost each launcher about a second of CPU before it starts its workers
    from slimpar.train.trainer import Trainer

    try:
        Trainer(cfg, ctx, stop).run()
        if dist.is_initialized() and dist.get_world_size() > 1:
            # every rank done before any tears down: gloo can abort (SIGABRT) in destroy_process_group
            # while a peer still has a send in flight, which would turn a finished run into a failed one
            dist.barrier()
    except KeyboardInterrupt:  # Ctrl-C reaches every worker: the launcher says where the run is, once
        raise SystemExit(130) from None
    except preempt.Stopped:  # every rank saved the step's checkpoint; rank 0 recorded it (preempt.py)
        if ctx.is_main:
            _speak_if_alone(preempt.read_record(Path(out_dir)) or {}, out_dir)
        raise SystemExit(preempt.EXIT_CODE) from None
    except TrainingDiverged as e:
        if ctx.is_main:  # every rank reached the same verdict; one message is enough
            print(f"slimpar: error: {e}", file=sys.stderr, flush=True)
        failure.record(out_dir, "the NaN guard", str(e), 1)
        raise SystemExit(1) from None
    except (ConfigError, DataUnavailable) as e:  # input found wrong only inside the run (a checkpoint, data)
        if ctx.is_main:
            print(f"slimpar: error: {e}", file=sys.stderr, flush=True)
        failure.record(out_dir, "this input error", str(e), 2)
        raise SystemExit(2) from None
    except ReplicaMismatch as e:
        print(f"slimpar: error: rank {ctx.rank}: {e} (checked every sdp.check_every = {cfg.sdp.check_every} "
              "steps): a worker's copy drifted from its holders' (a memory fault, or a kernel that is not "
              "deterministic across workers). Resume from the newest checkpoint (the same command, or "
              "--max-restarts N to do it by itself); if it recurs, report it with the run folder",
              file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as e:  # DCP's CheckpointException derives from BaseException
        if stop.signum and isinstance(e, Exception):  # a peer that stopped first (preempt.py): the stop says it all
            raise SystemExit(preempt.EXIT_CODE) from None
        if peer_lost(e):  # a dead peer (a node gone): one paragraph; an elastic agent re-forms the job
            print(peer_lost_message(e, ctx), file=sys.stderr, flush=True)
            raise SystemExit(1) from None
        if disk_full(e):
            message = (f"the disk is full (No space left on device, or a short write) under {out_dir}: the step's "
                       "checkpoint was not written and its partial folder removed; free space (or lower "
                       "--checkpoint.keep_last), then resume with the same command")
            if ctx.is_main:
                print(f"slimpar: error: {message}", file=sys.stderr, flush=True)
            failure.record(out_dir, "the full disk", message, 1)
            raise SystemExit(1) from None
        if not is_timeout(e):
            if failure.debugging() or not isinstance(e, Exception):
                raise
            # a bug: one paragraph per rank, the traceback with --debug
            print(failure.internal_error(e, f" on rank {ctx.rank}"), file=sys.stderr, flush=True)
            raise SystemExit(1) from None
        print(timeout_message(e, cfg, ctx), file=sys.stderr, flush=True)
        wake_stopped_siblings()
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            # the run's objects, and the process groups they hold, freed while the interpreter is whole: a gloo
            # group destroyed during finalization can abort a finished worker (SIGABRT)
            gc.collect()
            dist.destroy_process_group()


ATTEMPT_PREFIX = "slimpar/attempt"


def init_attempt_group(cfg: Config) -> None:
    """Create the default process group on a store namespace of its own for each restart of the job.

    Why: under torch's elastic agent (torchrun, and slimpar's launcher, which uses the same agent) the
    workers do not host the TCPStore at ``MASTER_ADDR:MASTER_PORT``: the agent does
    (``TORCHELASTIC_USE_AGENT_STORE=True``), and that store outlives the workers across restarts.
    ``init_process_group("env://")`` writes the same keys in every attempt (``default_pg/0/...``:
    gloo's address of each rank, the start-up barrier), so after a restart a new worker can read a
    dead worker's address from the first attempt and fail with gloo's "Connection refused" (or wait
    on a barrier count that is already spent): torch 2.13 issue, reproduced with a bare gloo script
    under ``torchrun --max-restarts 1``. Prefixing every key with the restart count gives each attempt
    a clean namespace on the same store. Without the agent's store (another launcher) torch's own
    ``env://`` start is used unchanged (by :func:`~slimpar.train.job.context.init_context`).
    """
    if (dist.is_initialized() or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
            or "MASTER_ADDR" not in os.environ):
        return
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if not mode_of(cfg).needs_group(cfg, world):
        return
    timeout = timedelta(seconds=cfg.parallel.timeout_s)
    device = worker_device(cfg)  # the same GPU init_context binds (gloo workers may share one)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timeout)
    store = dist.PrefixStore(f"{ATTEMPT_PREFIX}{restart_count()}", store)
    dist.init_process_group(cfg.parallel.backend, store=store, rank=rank, world_size=world, timeout=timeout,
                            device_id=nccl_device_id(cfg.parallel.backend, device))


def disk_full(e: BaseException) -> bool:
    """Whether ``e`` (or what it wraps: DCP collects each rank's error into a CheckpointException) is ENOSPC."""
    seen: list[BaseException] = []
    todo: list[object] = [e]
    while todo:
        x = todo.pop()
        if not isinstance(x, BaseException) or any(x is y for y in seen):
            continue
        seen.append(x)
        if isinstance(x, OSError) and x.errno == errno.ENOSPC:
            return True
        wrapped = getattr(x, "failures", {}).values()  # DCP: rank -> (exception, stack summary)
        todo += [x.__cause__, x.__context__,
                 *(w[0] if isinstance(w, tuple) else getattr(w, "exc", w) for w in wrapped)]
    # torch.save's zip writer reports a short write as "unexpected pos", without the OSError behind it
    return any("No space left on device" in str(x) or ("unexpected pos" in str(x) and "inline_container" in str(x))
               for x in seen)


def is_timeout(e: BaseException) -> bool:
    """Whether ``e`` is a collective (or store) that gave up waiting: gloo and NCCL say "timed out"/"timeout"."""
    text = str(e).lower()
    return isinstance(e, (RuntimeError, dist.DistError)) and ("timed out" in text or "timeout" in text)


def peer_lost(e: BaseException) -> bool:
    """Whether ``e`` is a collective whose peer's connection broke (gloo: "Connection closed by peer",
    "Connection reset by peer"): that worker's process, or its whole node, is gone."""
    text = str(e).lower()
    return isinstance(e, (RuntimeError, dist.DistError)) and ("closed by peer" in text or "reset by peer" in text)


def peer_lost_message(e: BaseException, ctx: RunContext) -> str:
    first = str(e).strip().splitlines()[0][:300]
    return (f"slimpar: error: rank {ctx.rank} of {ctx.world} lost a peer in {failed_operation(e)}: another worker "
            "or its node died. Under torchrun --nnodes MIN:MAX --max-restarts K the surviving agents re-form the "
            "job and it resumes from the newest checkpoint (docs/multinode.md, Elastic runs); otherwise resume it "
            f"with the same command. (torch: {first})")


def failed_operation(e: BaseException) -> str:
    """The collective that failed and the slimpar line that called it, read from the traceback."""
    frames = traceback.extract_tb(e.__traceback__)
    c10d = [f for f in frames if f.filename.endswith("distributed_c10d.py")]
    ours = [f for f in frames if "/slimpar/" in f.filename.replace("\\", "/")]
    op = c10d[-1].name if c10d else "a collective inside torch (e.g. DDP's gradient all-reduce)"
    if not ours:
        return op
    f = ours[-1]
    where = f.filename.replace("\\", "/").split("/slimpar/", 1)[-1]
    return f"{op}, called from slimpar/{where}:{f.lineno} ({f.line})"


def wake_stopped_siblings() -> None:
    """Send SIGCONT to the other workers of this job on this machine (same parent, same interpreter).

    When this worker exits, the launcher (torch's elastic agent, like torchrun's) sends the others
    SIGTERM and waits a fixed 30 s before SIGKILL. A worker stopped by SIGSTOP (job control, a
    debugger detaching badly) keeps SIGTERM pending for all that time, so the job would outlive its
    timeout by 30 s. SIGCONT lets the pending SIGTERM end it at once; for a running worker it is a
    no-op. Processes of other jobs are never touched: only children of this worker's own launcher.
    """
    me, parent = os.getpid(), os.getppid()
    try:
        mine = os.readlink(f"/proc/{me}/exe")
        pids = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and int(d.name) != me]
    except OSError:  # no /proc (not Linux): the launcher's own grace period applies
        return
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            same = os.readlink(f"/proc/{pid}/exe") == mine
            if same and int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                os.kill(pid, signal.SIGCONT)
        except (OSError, ValueError, IndexError):
            continue


def timeout_message(e: BaseException, cfg: Config, ctx: RunContext) -> str:
    first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    return (f"slimpar: error: rank {ctx.rank} of {ctx.world} gave up after waiting parallel.timeout_s = "
            f"{cfg.parallel.timeout_s:g} s in {failed_operation(e)}. Another worker stopped answering: it may be "
            "hung or stopped (SIGSTOP, a debugger, swapping), deadlocked, killed, or far slower than the rest. "
            "Check the other ranks' output and the machine's memory and load; if a step, evaluation or "
            f"checkpoint legitimately takes longer, raise --parallel.timeout_s. (torch: {first})")
