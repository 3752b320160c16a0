"""Save on preemption: SIGTERM (a spot instance's notice, a container stop, ``scancel``) or SIGUSR1 (SLURM's
``--signal``) asks every rank to finish the step it is in, write a checkpoint there and exit with code 143.

Algorithm, in every worker (:func:`slimpar.train.launch.worker.worker_main` installs a :class:`StopRequest`):

1. The handler only notes the signal and starts the grace clock. Before the training loop (nothing trained in this
   invocation, nothing to save) it raises :class:`Preempted` instead, which ends the worker at once.
2. At every step boundary each rank all-reduces (MAX) one int32 on the run's device, the signal it received or 0:
   one small collective per step (:meth:`StopRequest.agreed`). Every rank gets the same answer after the same
   step, so all stop there, also when the signal reached only some of them (a ``kill`` of one pid, a launcher that
   forwards it to its own workers only, a death signal of a launcher on one node).
3. They save the checkpoint of that step (the trainer skips the save when its periodic one just wrote it); rank 0
   records the stop in ``OUT/.slimpar-stopped.json`` (:data:`RECORD`) and every rank exits with 143.
4. Grace: ``checkpoint.on_signal_s`` after the signal a watcher thread ends the process with 143 whatever it is
   doing (a long step, a save, a peer that never answers); rank 0 records that nothing was saved. A save cut short
   leaves a folder without ``trainer.json``, which is never resumed from.

The Python-level handler takes no lock and starts no thread: it runs in the main thread between bytecodes, also
inside itself (a second signal while the first one's handler waits, e.g. SLURM's signal to every process plus the
launcher's forwarded copy), and a handler that started the grace timer under a lock deadlocked there, its rank
hanging in the step until the grace ended it without a checkpoint. The grace clock belongs to the watcher thread
alone.

Who prints the closing line (:func:`stop_message`, from the record): the process that launched the run, which knows
the command that resumes it: slimpar's launcher, an in-process run's CLI, torchrun's rank 0. A worker prints it
itself only where that process is gone (its launcher was killed: :mod:`slimpar.train.job.parent`) or where the
grace timer ends the process that would have printed it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from slimpar.train.checkpoint.folders import latest_checkpoint
from slimpar.train.job import parent
from slimpar.utils import write_text_atomic

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_CODE = 143  # 128 + SIGTERM, what a process killed by SIGTERM reports; also for SIGUSR1's stop
RECORD = ".slimpar-stopped.json"  # in the run folder: the last stop (cleared by the next invocation)
RESUME_ENV = "SLIMPAR_RESUME_COMMAND"  # the CLI's resume command, for a worker that speaks itself


class Preempted(BaseException):
    """A stop signal before the training loop: nothing of this invocation to save (a BaseException, like
    KeyboardInterrupt, so that no ``except Exception`` on the way swallows it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Stopped(Exception):
    """Every rank stopped after step ``step`` on a stop signal and saved its checkpoint at ``path``."""

    def __init__(self, signum: int, step: int, path: Path | None):
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}")
        self.signum, self.step, self.path = signum, step, path


class StopRequest:
    """This process's stop signal, its grace clock and the step boundary's agreement (see the module docstring).

    ``active = False`` (a Trainer built outside a worker: tests, notebooks) installs nothing and never stops."""

    def __init__(self, grace_s: float, out_dir: Path, is_main: bool, active: bool = True):
        self.grace_s, self.out_dir, self.is_main, self.active = grace_s, Path(out_dir), is_main, active
        self.signum = 0  # the first stop signal received, 0 = none
        self.in_loop = False  # set by the trainer when its step loop starts (:meth:`arm`)
        self.saved_step: int | None = None
        self._pipe = -1  # the write end of the watcher's pipe (:meth:`install`)

    @classmethod
    def inactive(cls) -> StopRequest:
        return cls(0.0, Path("."), False, active=False)

    def install(self) -> None:
        """Handle SIGTERM and SIGUSR1 in this process (main thread only: Python's rule for handlers).

        Python runs a handler only when the main thread is back in the interpreter, and a rank blocked in a
        collective (a peer that hangs: the case the grace time is for) may not be back for minutes. So the
        signal's number also goes to a pipe (``signal.set_wakeup_fd``, written by the C-level handler at once)
        that a thread watches: the grace clock starts when the signal arrives."""
        if self.active and threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handler) for s in STOP_SIGNALS}
            read, self._pipe = os.pipe()
            os.set_blocking(self._pipe, False)
            self._wakeup = signal.set_wakeup_fd(self._pipe, warn_on_full_buffer=False)
            threading.Thread(target=self._watch, args=(read,), daemon=True, name="slimpar-stop-signal").start()

    def uninstall(self) -> None:
        """The handlers from before :meth:`install` (an in-process run returns to the command line's)."""
        for s, handler in getattr(self, "_previous", {}).items():
            signal.signal(s, handler)
        if hasattr(self, "_wakeup"):
            signal.set_wakeup_fd(self._wakeup)

    def _watch(self, fd: int) -> None:
        """The grace clock: wait for the first stop signal's number on the pipe (written by the C-level handler at
        once, and by :meth:`_handler`), then ``grace_s``, then end the process (:meth:`_expired`)."""
        number = 0
        while not number:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:
                return
            number = next((n for n in data if n in STOP_SIGNALS), 0)
        self._note(number)
        time.sleep(self.grace_s)
        self._expired()

    def arm(self) -> None:
        """From here on a signal stops at the next step boundary instead of ending the process at once."""
        self.in_loop = True

    def _handler(self, signum, frame) -> None:
        """Note the signal and tell the watcher (which starts the clock once, also where something replaced the
        wakeup fd); no lock, no thread: this may run inside itself (module docstring)."""
        self._note(signum)
        try:
            os.write(self._pipe, bytes([signum]))
        except OSError:  # a full pipe: the watcher has its byte already
            pass
        if not self.in_loop:
            raise Preempted(signum)

    def _note(self, signum: int) -> None:
        """Remember the first stop signal (from the handler or the watcher: a plain store, no lock)."""
        if not self.signum:
            self.signum = int(signum)

    def agreed(self, group, device) -> int:
        """The stop signal any rank received (0: none), the same on every rank: one all-reduce (MAX) of an int32
        created on ``device`` (the run's: NCCL reduces only GPU tensors)."""
        if not self.active:
            return 0
        if group is None:
            return self.signum
        import torch
        import torch.distributed as dist

        flag = torch.tensor([self.signum], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return int(flag.item())

    def stopped(self, signum: int, step: int, path: Path | None, finished: bool = False) -> Stopped:
        """The checkpoint of ``step`` is saved on every rank (``finished``: the run's last step, its outputs written):
        rank 0 records the stop; returns the exception to raise."""
        self.saved_step = step
        if self.is_main:
            write_record(self.out_dir, {"signal": signal.Signals(signum).name, "saved": True, "step": step,
                                        "checkpoint": str(path), "finished": finished, "grace_s": self.grace_s})
        return Stopped(signum, step, path)

    def _expired(self) -> None:
        """The grace time is over: end this process now (rank 0 first records and, where no one else will, says
        that nothing was saved)."""
        if self.saved_step is None and self.is_main:
            record = {"signal": signal.Signals(self.signum).name, "saved": False, "step": None,
                      "newest": newest_step(self.out_dir), "grace_s": self.grace_s}
            write_record(self.out_dir, record)
            if not parent.launcher_alive():  # slimpar's launcher prints it from the record; else it is this process
                print(stop_message(record, os.environ.get(RESUME_ENV, "the same command"), self.out_dir),
                      file=sys.stderr, flush=True)
        os._exit(EXIT_CODE)


def write_record(out_dir: Path, record: dict) -> None:
    try:
        write_text_atomic(Path(out_dir) / RECORD, json.dumps({**record, "time": time.time()}))
    except OSError:  # a full or read-only disk: the closing line then says what it knows
        pass


def read_record(out_dir: Path) -> dict | None:
    try:
        data = json.loads((Path(out_dir) / RECORD).read_text())
        return data if isinstance(data, dict) and isinstance(data.get("signal"), str) else None
    except (OSError, ValueError):
        return None


def clear_record(out_dir: Path) -> None:
    try:
        (Path(out_dir) / RECORD).unlink()
    except FileNotFoundError:
        pass


def newest_step(out_dir: Path) -> int | None:
    """The step of the newest complete checkpoint in ``out_dir`` (None: none)."""
    path = latest_checkpoint(Path(out_dir))
    return int(path.name.split("_")[-1]) if path is not None else None


def stop_message(record: dict, again: str, out_dir: Path) -> str:
    """The closing line of a stopped run: the signal, the step saved (or why none was), the resume command."""
    sig = record.get("signal", "a stop signal")
    if record.get("finished"):
        return (f"slimpar: stopped by {sig} after the run had finished all {record['step']} steps (its outputs are "
                f"written); the run folder is {out_dir}")
    if record.get("saved"):
        return (f"slimpar: stopped by {sig}: every rank finished step {record['step']} and saved its checkpoint "
                f"({record.get('checkpoint')}); the run folder is {out_dir}; to resume it: {again}")
    newest = record.get("newest", newest_step(out_dir))
    since = f"from step {newest} (its newest checkpoint)" if newest is not None else "from step 0 (no checkpoint)"
    if record.get("before_training"):
        why = "before its first step: nothing to save"
    elif record.get("grace_s") is not None:
        why = (f"without a checkpoint: none was written within checkpoint.on_signal_s = {record['grace_s']:g} s "
               "(a step, a save or a peer took longer; raise it to give the save more time)")
    else:
        why = "without a checkpoint: the workers ended before they could save one"
    return f"slimpar: stopped by {sig} {why}; the run folder is {out_dir}; it resumes {since}: {again}"


def closing_line(e: BaseException, out_dir: Path, again: str) -> str | None:
    """The closing line where ``e`` (what the launcher or an in-process run raised) ends a stop: Preempted (the
    CLI's own handler, before any worker trained), the elastic agent's SignalException for SIGTERM or SIGUSR1,
    exit 143, or worker failures behind which rank 0 recorded a stop (the signal reached the workers only).
    None for every other ending."""
    if isinstance(e, Preempted):
        return stop_message({"signal": signal.Signals(e.signum).name, "before_training": True}, again, out_dir)
    record = read_record(out_dir)
    sigval = getattr(e, "sigval", None)  # torch.distributed.elastic.multiprocessing.api.SignalException
    stop = sigval in STOP_SIGNALS or (isinstance(e, SystemExit) and e.code == EXIT_CODE)
    if record is None and stop:  # the workers ended before rank 0 recorded anything (or could not write it)
        record = {"signal": signal.Signals(sigval).name if sigval in STOP_SIGNALS else "a stop signal"}
    if record is None or not (stop or stopped_themselves(getattr(e, "failures", None))):
        return None
    return stop_message(record, again, out_dir)


def stopped_themselves(failures: dict | None) -> bool:
    """Whether every failed worker (torch's ProcessFailure records) exited with 143 by itself: a stop signal that
    reached the workers only. A worker that died otherwise makes it a failure: the agent's closing SIGTERM to the
    survivors of a failure also ends them with 143 (and may leave a record behind)."""
    return bool(failures) and all(getattr(f, "exitcode", None) == EXIT_CODE for f in failures.values())
