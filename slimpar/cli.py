"""``slimpar`` command line: train, eval, sample, export, plan, bench.

Every subcommand validates its whole configuration first; a bad input prints one message that
names the fix and exits with code 2 before any process group is created or any file is written.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

from slimpar import __version__, torch_range
from slimpar.cli_help import config_help
from slimpar.commands import train as train_cmd
from slimpar.config import DEFAULT_CONFIG, Config, ConfigError
from slimpar.train.job.preempt import EXIT_CODE, STOP_SIGNALS, Preempted
from slimpar.train.launch.failure import debugging, internal_error
from slimpar.utils import exit_failed


def _eval(args: argparse.Namespace, rest: list[str]) -> int:
    if args.lm_eval:
        if rest:
            raise ConfigError(f"unexpected arguments with --lm-eval: {' '.join(rest)}")
        from slimpar.commands.lm_eval import lm_eval_command

        return lm_eval_command(args.run, args.lm_eval, args.limit, args.verbose)
    from slimpar.commands.evaluate import evaluate_run

    evaluate_run(Path(args.run), rest, through_codecs=args.through_codecs)
    return 0


def _export(args: argparse.Namespace, rest: list[str]) -> int:
    if rest:
        raise ConfigError(f"unexpected arguments {' '.join(rest)}; usage: slimpar export --hf RUN OUT")
    from slimpar.commands.export_hf import export_command

    return export_command(*args.hf)


def _sample(args: argparse.Namespace, rest: list[str]) -> int:
    if rest:
        dashed = [w.replace("_", "-") for w in rest if w.startswith("--") and "_" in w]
        hint = f" (options are spelled with dashes: {' '.join(dashed)})" if dashed else ""
        raise ConfigError(f"unexpected arguments {' '.join(rest)}{hint}; usage: slimpar sample --run RUN --prompt TEXT "
                          "[--max-new-tokens N] [--temperature T] [--top-k K] [--seed SEED]")
    from slimpar.commands.sample import sample_command

    return sample_command(args.run, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed)


def _plan(args: argparse.Namespace, rest: list[str]) -> int:
    if args.fit:
        if args.memory or args.ranks:
            raise ConfigError("plan --fit scores every candidate itself: leave out --memory and --ranks")
        from slimpar.commands.plan_fit import fit_command

        return fit_command(args, rest)
    if args.memory:
        from slimpar.commands.plan_memory import memory_command

        return memory_command(args, rest)
    from slimpar.commands.plan import plan_command

    return plan_command(args, rest)


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    from slimpar.cli_bench import load_benchmarks_cli  # the checkout's benchmarks/, found by path

    return load_benchmarks_cli().bench_command(args, rest)


def _help_config(argv: list[str]) -> tuple[Config | None, str]:
    """The config whose values ``train --help`` and ``plan --help`` show: ``--config``'s, else the packaged
    default; (None, "") when no help is asked for (nothing is loaded) or the config does not load."""
    if not argv or argv[0] not in ("train", "plan") or not {"-h", "--help"} & set(argv):
        return None, ""
    name = None
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--config="):
            name = arg.split("=", 1)[1]
    from slimpar.config import load_config

    try:
        return load_config(name or DEFAULT_CONFIG), f"--config {name}" if name else "the default config"
    except ConfigError:
        return None, ""


def build_parser(help_cfg: Config | None = None, help_source: str = "") -> argparse.ArgumentParser:
    # the module docstring's first line without its reST markup: help prints it as plain text
    p = argparse.ArgumentParser(prog="slimpar", description=__doc__.splitlines()[0].replace("``", ""))
    p.add_argument("--version", action="version", version=f"slimpar {__version__}; {torch_range.describe()}")
    p.add_argument("--debug", action="store_true",
                   help="show Python tracebacks of internal errors (anywhere on the line; or SLIMPAR_DEBUG=1)")
    sub = p.add_subparsers(dest="command")
    fields = {"epilog": config_help(help_cfg, help_source), "formatter_class": argparse.RawDescriptionHelpFormatter}
    t = sub.add_parser("train", help="train a model (no arguments: the embedded default run)",
                       description="Train a model; every config field below can be overridden.", **fields)
    t.add_argument("--config", help="TOML file or packaged config name (default: the embedded default)")
    t.add_argument("--out", help="run folder for metrics, checkpoints and the summary")
    start = t.add_mutually_exclusive_group()
    start.add_argument("--resume", nargs="?", const="auto", default=train_cmd.AUTO, choices=["auto"],
                       help="auto (the default): continue from the newest complete checkpoint in --out if it "
                            "holds one, else start at step 0; metrics.jsonl is cut back to that checkpoint's step")
    start.add_argument("--fresh", action="store_true",
                       help="start over in --out: after validation passes, delete its checkpoints/, metrics.jsonl, "
                            "summary.json, model.safetensors, manifest.json, eval.json, init_from.json, tensorboard/, "
                            "mlruns/ and membership.json (the config's checkpoint.resume = false)")
    t.add_argument("--max-restarts", dest="max_restarts", type=int, metavar="N",
                   help="restart all workers after a failure (a killed or hung worker) up to N times; each restart "
                        "resumes from the newest checkpoint (the config's parallel.max_restarts; under torchrun "
                        "use its own --max-restarts)")
    t.add_argument("--allow-change", dest="allow_change", action="store_true",
                   help="resume a run folder although settings that define the run (model, data, seed, optimizer, "
                        "schedule such as train.steps) differ from its config.toml: without it that is exit 2")
    t.add_argument("--print-config", dest="print_config", action="store_true",
                   help="print the resolved config (the --config file with every override applied) as TOML and exit")
    t.set_defaults(func=train_cmd.train_command)
    e = sub.add_parser("eval", help="evaluate a finished run folder")
    e.add_argument("--run", required=True, help="run folder written by slimpar train")
    e.add_argument("--through-codecs", dest="through_codecs", action="store_true",
                   help="a pipeline run: evaluate through its boundary codecs, as the pipeline trained (all stages "
                        "in one process; writes eval_through_codecs.json); default: the model without its codecs")
    e.add_argument("--lm-eval", dest="lm_eval", metavar="TASKS",
                   help="evaluate with lm-evaluation-harness instead: 'slimpar' (all local tasks: shakespeare_bpb, "
                        "wikipedia_bpb, shakespeare_nextline) and/or lm-eval task names found in the local cache")
    e.add_argument("--limit", type=int, help="with --lm-eval: at most this many documents per task")
    e.add_argument("--verbose", action="store_true",
                   help="with --lm-eval: show the progress bars of lm-eval, datasets and transformers (hidden)")
    e.set_defaults(func=_eval)
    x = sub.add_parser("export", help="write a finished run in another format (Hugging Face LLaMA)")
    x.add_argument("--hf", nargs=2, metavar=("RUN", "OUT"), required=True,
                   help="RUN folder -> OUT folder loadable by transformers' from_pretrained (model and tokenizer)")
    x.set_defaults(func=_export)
    sm = sub.add_parser("sample", help="generate text from a finished LLaMA run's model and tokenizer")
    sm.add_argument("--run", required=True, help="run folder written by slimpar train (with model.safetensors)")
    sm.add_argument("--prompt", required=True, help="the text to continue (encoded after an end-of-text token)")
    sm.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=64, metavar="N",
                    help="generate at most N tokens; an end-of-text token ends sooner (default 64)")
    sm.add_argument("--temperature", type=float, default=0.8, metavar="T",
                    help="divide the logits by T before sampling; 0 = greedy, always the most likely token (0.8)")
    sm.add_argument("--top-k", dest="top_k", type=int, default=50, metavar="K",
                    help="sample only among the K most likely tokens; 0 = all (default 50)")
    sm.add_argument("--seed", type=int, default=0, help="the sampling seed: the same seed, the same text (0)")
    sm.set_defaults(func=_sample)
    pl = sub.add_parser("plan", help="print an SDP mask plan and its report", **fields)
    pl.add_argument("--config", help="TOML file or packaged config name (default: the embedded default)")
    pl.add_argument("--json", action="store_true", help="print the report as one JSON object")
    pl.add_argument("--memory", action="store_true",
                    help="predict each worker's peak memory (parameters, gradients, optimizer state, activations) "
                         "of the run the config describes, in any parallel.mode and at any model size, "
                         "without allocating it (docs/memory.md)")
    pl.add_argument("--ranks", default=None, metavar="R,R",
                    help="with --memory: only these workers (default: all)")
    pl.add_argument("--fit", action="store_true",
                    help="rank DDP, FSDP2, SDP, pipelines and the hybrid for the config's model on a cluster "
                         "(--cluster.preset h100|h200|a100-80gb|l4|this, --cluster.nodes, --cluster.gpus_per_node, "
                         "--cluster.gpu_memory, --cluster.intra_gbps, --cluster.inter_gbps, --cluster.tflops, "
                         "--cluster.mfu; --fit.objective time|time_at_quality|memory, --fit.max_gap, --fit.tokens, "
                         "--fit.jobs, --fit.candidates): memory, bytes, step time and loss gap (docs/planning.md)")
    pl.set_defaults(func=_plan)
    b = sub.add_parser("bench", help="side-by-side benchmarks")
    b.add_argument("which", choices=["sdp", "mapl", "quality", "plans", "wallclock", "memory", "readme", "gpu",
                                         "modes", "throughput", "fit", "ops"],
                   help="readme: write the measured blocks of README.md and docs/results from the committed results "
                        "(no --out)")
    b.add_argument("--quick", action="store_true", help="a short version (under 5 minutes)")
    b.add_argument("--out", default=None, help="folder for results.json, report.md and plots (required, except "
                   "for readme)")
    b.add_argument("--check", action="store_true",
                   help="readme: compare those pages with what the results give, write nothing; exit 1 if they differ")
    b.add_argument("--steps", type=int, default=None,
                   help="training steps per row of the full benchmark (default: sdp/mapl 100, quality 2000, modes 10)")
    b.add_argument("--rows", default="", help="comma-separated groups, rows (name or group/name) or runs "
                   "(group/name/sSEED); default: every row, except for quality: its core set (lr-sweep, tuned, "
                   "sdp-lr-sweep, sdp-tuned), the other groups (one-rate, length, width, unseen-config, ...: "
                   "benchmarks/quality/rows.py) run when named; finished runs are reused; gpu: the check part unless "
                   "'speed' (the throughput rows) is named; throughput: rows or the groups plain, trainer, pipeline; "
                   "ops: model sizes (tiny, small, 134m)")
    b.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="mapl: cuda runs every row as a virtual pipeline on one GPU (no links, no throttling); gpu: "
                        "the device check's (default cuda where one is present; cpu runs its rows on gloo)")
    b.add_argument("--jobs", type=int, default=None,
                   help="rows run at once (default 1: CPU timings need it; quality: 2, one thread each)")
    b.add_argument("--report-only", action="store_true",
                   help="quality only: write the report from the finished runs in OUT, train nothing")
    b.add_argument("--timing-rounds", type=int, default=None,
                   help="sdp/mapl: short reruns of every row, interleaved, for step-time ratios as median [range] "
                        "(default 2; 0 with --quick)")
    b.add_argument("--no-links", dest="links", action="store_false",
                   help="sdp/mapl: skip the runs over throttled links (slimpar bench wallclock measures links)")
    b.add_argument("--size", default="tiny", help="throughput: the LLaMA size (tiny on a CPU; 134m on a GPU)")
    b.add_argument("--compile-backend", default="inductor", choices=["inductor", "aot_eager", "eager"],
                   help="throughput: the compiled rows' backend (aot_eager and eager only check graph capture)")
    b.add_argument("--seeds", default="0,1", help="sdp: seeds of the main rows (DDP, B-SDP 0.5, N-SDP 0.5)")
    b.set_defaults(func=_bench)
    return p


def _preflight(args: argparse.Namespace) -> None:
    """Checks of the run folder that must happen before any process starts or any file is written:
    ``--out`` must be a folder, and the checkpoint a resume would load must verify (manifest, trainer.json)."""
    if args.command != "train" or not getattr(args, "out", None):
        return
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {args.out!r} exists and is not a folder; give a run folder")
    resume = getattr(args, "resume", False)
    if resume and str(resume).lower() not in ("false", "no", "never", "0") and not getattr(args, "fresh", False):
        from slimpar.train.checkpoint.preflight import check_resume

        check_resume(out)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in argv:  # anywhere on the line, for every command
        argv = [a for a in argv if a != "--debug"]
        os.environ["SLIMPAR_DEBUG"] = "1"
    try:
        if "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun worker ends with its agent (train/job/parent.py)
            from slimpar.train.job.parent import die_with_parent

            die_with_parent()
        if threading.current_thread() is threading.main_thread():  # after __main__.py's start-up handler
            signal.signal(signal.SIGINT, train_cmd.on_ctrl_c)
            for sig in STOP_SIGNALS:  # until a run's own handler takes over (train/job/preempt.py)
                signal.signal(sig, train_cmd.on_stop_signal)
        if "--version" not in argv:  # --version reports an unsupported torch instead of refusing it
            torch_range.check_torch()
        parser = build_parser(*_help_config(argv))
        args, rest = parser.parse_known_args(argv)
        args.argv = argv
        if args.command is None:
            parser.print_help()
            return 0
        _preflight(args)
        return args.func(args, rest)
    except (ConfigError, torch_range.UnsupportedTorch) as e:
        print(f"slimpar: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before a run folder exists (a run's own Ctrl-C: commands/train.py)
        print("\nslimpar: interrupted", file=sys.stderr, flush=True)
        return 130
    except Preempted as e:  # before a run folder exists: nothing started, nothing written
        print(f"slimpar: stopped by {e} before the run started; nothing was written", file=sys.stderr, flush=True)
        return EXIT_CODE
    except Exception as e:  # a bug in slimpar (or in what it calls): one paragraph unless --debug
        if train_cmd.CTRL_C.is_set():  # the interrupt, surfacing as another error (commands/train.py)
            print("\nslimpar: interrupted", file=sys.stderr, flush=True)
            return 130
        if debugging():
            raise
        print(internal_error(e), file=sys.stderr, flush=True)
        return 1


def entry() -> NoReturn:
    """The ``slimpar`` command and ``python -m slimpar``: :func:`main`, then its exit status.

    A failure (already reported) exits without the interpreter's teardown (why: :func:`slimpar.utils.exit_failed`).
    """
    code = main()
    if code:
        exit_failed(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
