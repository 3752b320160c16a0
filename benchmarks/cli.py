"""``slimpar bench sdp|mapl|quality|wallclock [--quick] --out DIR``, ``slimpar bench throughput --out DIR [--size
134m] [--device cuda] [--quick]``, ``slimpar bench gpu [--device cpu]`` (the device
check), ``slimpar bench plans --out DIR``,
``slimpar bench memory --out DIR`` (the paper's memory table, predicted), ``slimpar bench ops --out DIR [--rows
tiny,small,134m]`` (aten ops per step of the virtual pipeline's codecs) and ``slimpar bench readme [--check]``
(the measured blocks of README.md and docs/results from the committed results)."""

from __future__ import annotations

import argparse
from pathlib import Path


def bench_command(args: argparse.Namespace, rest: list[str]) -> int:
    from benchmarks.runner import stop_jobs_with_me

    with stop_jobs_with_me():
        return _bench(args, rest)


def _ops(args: argparse.Namespace, out: Path) -> dict:
    """``slimpar bench ops``: the CPU's count; ``--rows`` names model sizes (default: every one)."""
    from benchmarks.ops import SIZES, bench_ops
    from slimpar.config import ConfigError

    if args.device != "cpu":
        raise ConfigError("slimpar bench ops counts the aten ops of fp32 runs on the CPU; drop --device")
    named = _names(args.rows) or set(SIZES)
    unknown = sorted(named - set(SIZES))
    if unknown:
        raise ConfigError(f"slimpar bench ops has no size {', '.join(map(repr, unknown))}; its sizes: "
                          f"{', '.join(SIZES)}")
    return bench_ops(out, tuple(s for s in SIZES if s in named))


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    from slimpar.config import ConfigError

    if rest:
        raise ConfigError(f"slimpar bench takes no overrides, got {' '.join(rest)}")
    if args.device is None:
        import torch

        args.device = "cuda" if args.which in ("gpu", "throughput") and torch.cuda.is_available() else "cpu"
    if args.which == "readme":
        if args.out:
            raise ConfigError("slimpar bench readme writes the measured blocks of README.md and docs/results "
                              "from docs/results; it takes no --out")
        from benchmarks.readme import readme_command

        return readme_command(args.check)
    if args.check:
        raise ConfigError("--check applies to slimpar bench readme")
    if args.which == "gpu":  # the device check: its rows have their own steps and time limits
        from benchmarks.gpu_check import bench_gpu, default_folder

        out = Path(args.out) if args.out else default_folder()
        data = bench_gpu(out, args.device, _names(args.rows))
        print((out / "report.md").read_text())
        return 0 if all(r["status"] in ("ok", "not run") for r in data["rows"]) else 1
    if not args.out:
        raise ConfigError(f"--out DIR is required for slimpar bench {args.which} (the folder for its results)")
    out = Path(args.out)
    args.jobs = args.jobs if args.jobs is not None else (2 if args.which == "quality" else 1)
    steps = args.steps if args.steps is not None else (2000 if args.which == "quality" else 100)
    if steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {steps}")
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    if args.which == "sdp" and args.device != "cpu":
        raise ConfigError("slimpar bench sdp needs one process per worker; on one GPU use "
                          "python -m benchmarks.gpu (the per-worker memory probe)")
    if args.report_only and args.which != "quality":
        raise ConfigError("--report-only applies to slimpar bench quality")
    if args.which == "wallclock" and args.device != "cpu":
        raise ConfigError("slimpar bench wallclock times gloo workers on CPU over throttled links; drop --device")
    if args.which == "wallclock":
        import os

        if os.geteuid() != 0:
            raise ConfigError("slimpar bench wallclock builds network namespaces and needs root")
        from benchmarks.network.wallclock import bench_wallclock

        data = bench_wallclock(out, args.quick, _names(args.rows))
    elif args.which == "fit":
        import os

        if os.geteuid() != 0:
            raise ConfigError("slimpar bench fit builds network namespaces and needs root")
        from benchmarks.fit import bench_fit

        data = bench_fit(out, args.quick)
    elif args.which == "ops":
        data = _ops(args, out)
    elif args.which == "memory":
        from benchmarks.memory import bench_memory

        data = bench_memory(out)
    elif args.which == "plans":
        from benchmarks.plan_sim import bench_plans

        data = bench_plans(out)
    elif args.which == "quality":
        if args.device != "cpu":
            raise ConfigError("slimpar bench quality runs on CPU (one thread per run); drop --device")
        from benchmarks.quality.harness import bench_quality

        data = bench_quality(out, args.quick, _names(args.rows), jobs=args.jobs, steps=steps,
                             report_only=args.report_only)
    elif args.which == "throughput":
        from benchmarks.throughput import bench_throughput, parse_rows

        data = bench_throughput(out, args.size, args.device, args.quick, args.compile_backend, parse_rows(args.rows))
        print((out / "report.md").read_text())
        return 1 if any("error" in ln for ln in data["lines"]) else 0
    elif args.which == "modes":
        if args.device != "cpu":
            raise ConfigError("slimpar bench modes times every mode on the CPU; drop --device")
        from benchmarks.modes import bench_modes

        data = bench_modes(out, args.quick, args.steps or 10, _names(args.rows), rounds=_rounds(args))
    elif args.which == "sdp":
        from benchmarks.sdp import bench_sdp

        data = bench_sdp(out, args.quick, steps, _names(args.rows), jobs=args.jobs, rounds=_rounds(args),
                         links=args.links, seeds=_seeds(args.seeds))
    else:
        from benchmarks.mapl import bench_mapl

        data = bench_mapl(out, args.quick, steps, _names(args.rows), device=args.device, jobs=args.jobs,
                          rounds=_rounds(args), links=args.links)
    print((out / "report.md").read_text())
    return 0 if data else 1


def _rounds(args: argparse.Namespace) -> int:
    from slimpar.config import ConfigError

    rounds = args.timing_rounds if args.timing_rounds is not None else (0 if args.quick else 2)
    if rounds < 0:
        raise ConfigError(f"--timing-rounds must be >= 0, got {rounds}")
    return rounds


def _seeds(text: str) -> tuple[int, ...]:
    from slimpar.config import ConfigError

    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ConfigError(f"--seeds takes comma-separated integers, got {text!r}") from None
    if not seeds:
        raise ConfigError("--seeds needs at least one seed")
    return seeds


def _names(rows: str) -> set[str] | None:
    return {r.strip() for r in rows.split(",") if r.strip()} or None
