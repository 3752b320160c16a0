"""The entry point of each worker process: join or create the process group, train, clean up.

Two failures end a worker with one clear paragraph instead of a deep traceback: a diverged run
(:class:`~slimpar.train.guard.TrainingDiverged`) and a collective that waited ``parallel.timeout_s`` for a
peer that never came (a hung, stopped or dead worker). Either way the process exits non-zero, so the
launcher (slimpar's or torchrun) ends the whole job instead of leaving it hanging.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from pathlib import Path

import torch.distributed as dist

from slimpar.config import Config, from_dict
from slimpar.train.context import RunContext, init_context
from slimpar.train.guard import TrainingDiverged
from slimpar.train.trainer import Trainer


def worker_main(cfg_dict: dict, out_dir: str) -> None:
    """Run one worker of a training job (called by the launcher in every process)."""
    cfg = from_dict(cfg_dict)
    ctx = init_context(cfg, Path(out_dir))
    try:
        Trainer(cfg, ctx).run()
    except TrainingDiverged as e:
        if ctx.is_main:  # every rank reached the same verdict; one message is enough
            print(f"slimpar: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except Exception as e:
        if not is_timeout(e):
            raise
        print(timeout_message(e, cfg, ctx), file=sys.stderr, flush=True)
        wake_stopped_siblings()
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def is_timeout(e: BaseException) -> bool:
    """Whether ``e`` is a collective (or store) that gave up waiting: gloo and NCCL say "timed out"/"timeout"."""
    text = str(e).lower()
    return isinstance(e, (RuntimeError, dist.DistError)) and ("timed out" in text or "timeout" in text)


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
