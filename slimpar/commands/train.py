"""``slimpar train``: load and validate the config once, choose the run folder, launch, and after Ctrl-C, a stop
signal or a failure say in one line where the run is and the command that continues it."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import threading
from pathlib import Path

from slimpar.config import DEFAULT_CONFIG, Config, ConfigError
from slimpar.train.job.preempt import EXIT_CODE, RESUME_ENV, Preempted, closing_line
from slimpar.train.launch.failure import debugging, internal_error


class _Default(str):
    """A flag's default value that can be told apart from the same value given explicitly."""


AUTO = _Default("auto")

# Set by this process's Ctrl-C handler. An interrupt that lands inside a C extension's import can surface as
# another error: numpy turns it into ImportError, and the next import of numpy then raises "cannot load module
# more than once per process". Any error after a Ctrl-C is reported as the interrupt it came from.
CTRL_C = threading.Event()


def _raise_swallowed_ctrl_c() -> None:
    """A Ctrl-C that an import caught and hid (torch imports numpy as optional: an interrupted numpy import is an
    ImportError that torch catches, and the start-up would carry on) is raised again here."""
    if CTRL_C.is_set():
        raise KeyboardInterrupt


def on_ctrl_c(signum, frame):
    """Python's default SIGINT behaviour (raise KeyboardInterrupt), remembered in ``CTRL_C``."""
    CTRL_C.set()
    raise KeyboardInterrupt


def on_stop_signal(signum, frame):
    raise Preempted(signum)


def train_command(args: argparse.Namespace, rest: list[str]) -> int:
    """Load, adopt torchrun's world size, validate once, choose the run folder, launch.

    Nothing is deleted before validation has passed: ``--fresh`` clears the old run's outputs in
    :func:`slimpar.train.launch.launcher.prepare_out_dir`, after every check.
    """
    config = args.config or str(DEFAULT_CONFIG)
    from slimpar.config import load_config
    from slimpar.train.validate.checks import check_overrides_read, validate

    extra = ["--checkpoint.resume", "false"] if args.fresh else []
    if args.resume is not AUTO:  # an explicit --resume [auto] wins over a config's resume = false
        extra = ["--checkpoint.resume", "true"]
    if args.max_restarts is not None:
        extra += ["--parallel.max_restarts", str(args.max_restarts)]
    cfg = load_config(config, rest + extra)  # the flags win over the same keys given as overrides
    from slimpar.train.job.elastic import join_torchrun

    cfg = join_torchrun(cfg)
    from slimpar.train.validate.device import resolve_device, start_line

    device = resolve_device(cfg)  # after the world size is known, before any check reads the device
    if args.print_config:
        from slimpar.config import to_toml

        print(to_toml(cfg), end="")
        return 0
    validate(cfg)  # after the world size is known: under torchrun it is WORLD_SIZE
    check_overrides_read(cfg, rest)
    from slimpar.train.launch.launcher import default_run_folder, launch
    from slimpar.train.validate.limits import check_writable

    if args.out is not None:
        check_writable(args.out, "--out")
    out = Path(args.out) if args.out is not None else default_run_folder(config, cfg)
    check_writable(out, "the run folder")
    main = int(os.environ.get("RANK", "0")) == 0  # under torchrun every rank runs this; rank 0 speaks
    if cfg.checkpoint.resume:  # the checkpoint a resume would load must fit this run (layout.json): exit 2
        from slimpar.train.checkpoint.layout import keep_checkpoint_settings
        from slimpar.train.checkpoint.preflight import check_resume
        from slimpar.train.launch.rerun import check_rerun

        path = check_resume(out, cfg)
        if path is not None:  # and its run's settings must be this run's (config.toml), or --allow-change
            kept = keep_checkpoint_settings(cfg, path)  # e.g. the pipeline codecs' r, from the verified checkpoint
            if kept and main:
                print(kept, flush=True)
            check_rerun(out, cfg, path, int(path.name.split("_")[-1]), args.allow_change, main)
        from slimpar.train.checkpoint.init_from import check_init_from

        check_init_from(cfg, out)  # the init_from folder still holds what the run first started from
    _raise_swallowed_ctrl_c()  # before the run folder is announced: torch's import (in validate) may hide one
    again = resume_command(args.argv, out, bool(args.out))
    os.environ[RESUME_ENV] = again  # for a worker that must print a stop's closing line itself (preempt.py)
    if main:
        print(f"run folder: {out}  (to resume it: {again})", flush=True)
        print("\n".join(filter(None, [device.note, start_line(cfg, device)])), flush=True)
    code = launch_and_report(launch, cfg, out, again)
    if main and code == 0:
        print(f"run folder: {out}", flush=True)
    return code


def resume_command(argv: list[str], out: Path, given: bool) -> str:
    """The command that continues this run: the same one without ``--fresh`` (and with ``--out`` when the
    folder was not named: a changed working directory or config still finds it)."""
    from slimpar.train.job.elastic import under_torchrun

    words = [w for w in argv if w != "--fresh"]
    line = shlex.join(["slimpar", *words, *([] if given else ["--out", str(out)])])
    if not under_torchrun():
        return line
    # ranks started by torchrun, or one process per rank by another launcher (srun) with RANK and WORLD_SIZE set
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "launcher"
    return f"the same {launcher} command (... -m {line})"


def launch_and_report(launch, cfg: Config, out: Path, again: str) -> int:
    """Run the job; after Ctrl-C or a failure say where the run is and how to continue it, in one line.

    Ctrl-C reaches every process of the terminal's group: the workers end quietly (worker.py) and the
    elastic agent raises its SignalException, whose traceback (and the agent's log lines) would bury the
    run folder. A worker's own error was already printed by that worker; this adds where to continue."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        launch(cfg, out)
    except (KeyboardInterrupt, SignalException, SystemExit, ChildFailedError, Preempted) as e:
        if isinstance(e, SystemExit) and not e.code:
            raise
        stopped = closing_line(e, out, again)  # SIGTERM or SIGUSR1: the step saved (preempt.py)
        if stopped is not None:
            if int(os.environ.get("RANK", "0")) == 0:
                print(stopped, file=sys.stderr, flush=True)
            return EXIT_CODE
        if isinstance(e, (KeyboardInterrupt, SignalException)) or getattr(e, "code", None) == 130 or CTRL_C.is_set():
            return _interrupted(out, again)
        from slimpar.train.launch.launcher import describe_failure

        print(_failed(out, again, describe_failure(e) if isinstance(e, ChildFailedError) else ""), file=sys.stderr,
              flush=True)
        return 1
    except ConfigError:  # one line of its own, printed by main (exit 2)
        raise
    except Exception as e:  # an error of slimpar itself in this process: its paragraph, then where the run is
        if CTRL_C.is_set():  # the interrupt, surfacing as another error (see CTRL_C)
            return _interrupted(out, again)
        if debugging():
            print(_failed(out, again), file=sys.stderr, flush=True)
            raise
        print(f"{internal_error(e)}\n{_failed(out, again)}", file=sys.stderr, flush=True)
        return 1
    return 0


def _interrupted(out: Path, again: str) -> int:
    print(f"\nslimpar: interrupted; the run folder is {out}; to resume it: {again}", file=sys.stderr, flush=True)
    return 130


def _failed(out: Path, again: str, why: str = "") -> str:
    return (f"slimpar: training failed{f' ({why})' if why else ''}; the run folder is {out}; to resume it from its "
            f"newest checkpoint: {again}")
