"""``slimpar`` command line: train, eval, plan, bench.

Every subcommand validates its whole configuration first; a bad input prints one message that
names the fix and exits with code 2 before any process group is created or any file is written.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from slimpar.config import DEFAULT_CONFIG, Config, ConfigError, config_help


def _train(args: argparse.Namespace, rest: list[str]) -> int:
    config = args.config or str(DEFAULT_CONFIG)
    from slimpar.train.validate import load_run_config

    cfg = load_run_config(config, rest + (["--checkpoint.resume", "true"] if args.resume else []))
    cfg = _join_torchrun(cfg)
    out = Path(args.out or f"runs/{Path(config).stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    from slimpar.train.launch import launch

    launch(cfg, out)
    return 0


def _join_torchrun(cfg: Config) -> Config:
    import os

    from slimpar.train.launch import under_torchrun

    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if cfg.parallel.workers != world and int(os.environ.get("RANK", "0")) == 0:
            print(f"note: joining the torchrun group of {world} processes (parallel.workers = {world})")
        cfg.parallel.workers = world
        from slimpar.train.validate import validate

        validate(cfg)
    return cfg


def _eval(args: argparse.Namespace, rest: list[str]) -> int:
    from slimpar.train.evaluate_run import evaluate_run

    evaluate_run(Path(args.run), rest)
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
    p = argparse.ArgumentParser(prog="slimpar", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command")
    fields = {"epilog": config_help(), "formatter_class": argparse.RawDescriptionHelpFormatter}
    t = sub.add_parser("train", help="train a model (no arguments: the embedded default run)",
                       description="Train a model; every config field below can be overridden.", **fields)
    t.add_argument("--config", help="TOML file or packaged config name (default: the embedded default)")
    t.add_argument("--out", help="run folder for metrics, checkpoints and the summary")
    t.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    t.set_defaults(func=_train)
    e = sub.add_parser("eval", help="evaluate a finished run folder")
    e.add_argument("--run", required=True, help="run folder written by slimpar train")
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
    b.add_argument("which", choices=["sdp", "mapl", "plans"])
    b.add_argument("--quick", action="store_true", help="a short version (under 5 minutes)")
    b.add_argument("--out", required=True, help="folder for results.json, report.md and plots")
    b.add_argument("--steps", type=int, default=100, help="training steps per row of the full benchmark")
    b.add_argument("--rows", default="", help="comma-separated row names (default: all); finished rows are reused")
    b.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="mapl only: cuda runs every row as a virtual pipeline on one GPU (no links, no throttling)")
    b.add_argument("--jobs", type=int, default=1, help="rows run at once (for a GPU; CPU timings need 1)")
    b.set_defaults(func=_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.func(args, rest)
    except ConfigError as e:
        print(f"slimpar: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
