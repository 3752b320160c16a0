"""``slimpar`` command line: train, eval, export, plan, bench.

Every subcommand validates its whole configuration first; a bad input prints one message that
names the fix and exits with code 2 before any process group is created or any file is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slimpar import __version__
from slimpar.config import DEFAULT_CONFIG, Config, ConfigError, config_help


class _Default(str):
    """A flag's default value that can be told apart from the same value given explicitly."""


_AUTO = _Default("auto")


def _train(args: argparse.Namespace, rest: list[str]) -> int:
    """Load, adopt torchrun's world size, validate once, choose the run folder, launch.

    Nothing is deleted before validation has passed: ``--fresh`` clears the old run's outputs in
    :func:`slimpar.train.launch.prepare_out_dir`, after every check.
    """
    config = args.config or str(DEFAULT_CONFIG)
    from slimpar.config import load_config
    from slimpar.train.validate import validate

    extra = ["--checkpoint.resume", "false"] if args.fresh else []
    if args.resume is not _AUTO:  # an explicit --resume [auto] wins over a config's resume = false
        extra = ["--checkpoint.resume", "true"]
    if args.max_restarts is not None:
        extra += ["--parallel.max_restarts", str(args.max_restarts)]
    cfg = load_config(config, rest + extra)  # the flags win over the same keys given as overrides
    cfg = _join_torchrun(cfg)
    validate(cfg)  # after the world size is known: under torchrun it is WORLD_SIZE
    from slimpar.train.launch import default_run_folder, launch

    out = Path(args.out) if args.out else default_run_folder(config, cfg)
    if cfg.checkpoint.resume:  # the checkpoint a resume would load must fit this run (layout.json): exit 2
        from slimpar.train.checkpoint import check_resume

        check_resume(out, cfg)
    launch(cfg, out)
    return 0


def _join_torchrun(cfg: Config) -> Config:
    """Under torchrun, ``parallel.workers`` is the group's WORLD_SIZE (validated afterwards, by ``_train``)."""
    import os

    from slimpar.train.launch import under_torchrun

    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if cfg.parallel.workers != world and int(os.environ.get("RANK", "0")) == 0:
            print(f"note: joining the torchrun group of {world} processes (parallel.workers = {world})")
        cfg.parallel.workers = world
    return cfg


def _eval(args: argparse.Namespace, rest: list[str]) -> int:
    if args.lm_eval:
        if rest:
            raise ConfigError(f"unexpected arguments with --lm-eval: {' '.join(rest)}")
        from slimpar.train.lm_eval_run import lm_eval_command

        return lm_eval_command(args.run, args.lm_eval, args.limit, args.verbose)
    from slimpar.train.evaluate_run import evaluate_run

    evaluate_run(Path(args.run), rest, through_codecs=args.through_codecs)
    return 0


def _export(args: argparse.Namespace, rest: list[str]) -> int:
    if rest:
        raise ConfigError(f"unexpected arguments {' '.join(rest)}; usage: slimpar export --hf RUN OUT")
    from slimpar.train.export_hf import export_command

    return export_command(*args.hf)


def _plan(args: argparse.Namespace, rest: list[str]) -> int:
    from slimpar.train.plan_command import plan_command

    return plan_command(args, rest)


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    from slimpar.bench.cli import bench_command

    return bench_command(args, rest)


def build_parser() -> argparse.ArgumentParser:
    # the module docstring's first line without its reST markup: help prints it as plain text
    p = argparse.ArgumentParser(prog="slimpar", description=__doc__.splitlines()[0].replace("``", ""))
    p.add_argument("--version", action="version", version=f"slimpar {__version__}")
    sub = p.add_subparsers(dest="command")
    fields = {"epilog": config_help(), "formatter_class": argparse.RawDescriptionHelpFormatter}
    t = sub.add_parser("train", help="train a model (no arguments: the embedded default run)",
                       description="Train a model; every config field below can be overridden.", **fields)
    t.add_argument("--config", help="TOML file or packaged config name (default: the embedded default)")
    t.add_argument("--out", help="run folder for metrics, checkpoints and the summary")
    start = t.add_mutually_exclusive_group()
    start.add_argument("--resume", nargs="?", const="auto", default=_AUTO, choices=["auto"],
                       help="auto (the default): continue from the newest complete checkpoint in --out if it "
                            "holds one, else start at step 0; metrics.jsonl is cut back to that checkpoint's step")
    start.add_argument("--fresh", action="store_true",
                       help="start over in --out: after validation passes, delete its checkpoints/, metrics.jsonl, "
                            "summary.json, model.safetensors, manifest.json and eval.json (the config's "
                            "checkpoint.resume = false)")
    t.add_argument("--max-restarts", dest="max_restarts", type=int, metavar="N",
                   help="restart all workers after a failure (a killed or hung worker) up to N times; each restart "
                        "resumes from the newest checkpoint (the config's parallel.max_restarts; under torchrun "
                        "use its own --max-restarts)")
    t.set_defaults(func=_train)
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
    pl = sub.add_parser("plan", help="print an SDP mask plan and its report", **fields)
    pl.add_argument("--config", help="TOML file or packaged config name (default: the embedded default)")
    pl.add_argument("--json", action="store_true", help="print the report as one JSON object")
    pl.set_defaults(func=_plan)
    b = sub.add_parser("bench", help="side-by-side benchmarks")
    b.add_argument("which", choices=["sdp", "mapl", "quality", "plans", "wallclock"])
    b.add_argument("--quick", action="store_true", help="a short version (under 5 minutes)")
    b.add_argument("--out", required=True, help="folder for results.json, report.md and plots")
    b.add_argument("--steps", type=int, default=None,
                   help="training steps per row of the full benchmark (default: sdp/mapl 100, quality 2000)")
    b.add_argument("--rows", default="", help="comma-separated groups, rows (name or group/name) or runs "
                   "(group/name/sSEED); default: all; finished runs are reused")
    b.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="mapl only: cuda runs every row as a virtual pipeline on one GPU (no links, no throttling)")
    b.add_argument("--jobs", type=int, default=None,
                   help="rows run at once (default 1: CPU timings need it; quality: 2, one thread each)")
    b.add_argument("--report-only", action="store_true",
                   help="quality only: write the report from the finished runs in OUT, train nothing")
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
        from slimpar.train.checkpoint import check_resume

        check_resume(out)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        _preflight(args)
        return args.func(args, rest)
    except ConfigError as e:
        print(f"slimpar: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
