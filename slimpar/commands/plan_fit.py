"""``slimpar plan --fit``: the configurations of a model on a cluster, ranked (slimpar.plan.fit)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field

from slimpar.config import DEFAULT_CONFIG, ConfigError, apply_overrides, load_config
from slimpar.plan.cluster import Cluster, ClusterConfig, resolve_cluster
from slimpar.plan.fit import FitConfig, check_fit, fit
from slimpar.plan.shape import shape_of
from slimpar.plan.table import as_json, markdown


@dataclass
class FitRequest:
    """The ``--cluster.*`` and ``--fit.*`` overrides (the rest of the line is the run's config)."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    fit: FitConfig = field(default_factory=FitConfig)


def split_args(rest: list[str]) -> tuple[list[str], list[str]]:
    """(the ``--cluster.*``/``--fit.*`` overrides, the run config's overrides)."""
    mine, run, i = [], [], 0
    while i < len(rest):
        arg = rest[i]
        take = 1 if "=" in arg or i + 1 >= len(rest) else 2
        (mine if arg.startswith(("--cluster.", "--fit.")) else run).extend(rest[i:i + take])
        i += take
    return mine, run


def parse_request(rest: list[str]) -> tuple[FitRequest, list[str]]:
    """The request and the run's overrides; a bad field is a ConfigError that names it (exit 2)."""
    mine, run = split_args(rest)
    req = apply_overrides(FitRequest(), mine)
    check_fit(req.fit)
    return req, run


def header(cfg, cluster: Cluster, fc: FitConfig, seconds: float) -> str:
    s = shape_of(cfg)
    tokens = cfg.train.batch_size * cfg.data.seq_len
    total = fc.tokens or cfg.train.steps * tokens
    return (f"plan --fit: LLaMA {cfg.model.size} ({s.params / 1e6:,.3g}M parameters), {cfg.train.dtype}, global batch "
            f"{cfg.train.batch_size} x {cfg.data.seq_len} = {tokens:,} tokens a step, {total / s.params:.2g} tokens "
            f"per parameter; {cluster.nodes} x {cluster.gpus_per_node} {cluster.name} "
            f"({cluster.gpu_memory / 1024**3:.1f} GiB, {cluster.tflops:g} TFLOP/s at MFU {cluster.mfu:.2f}), links "
            f"{cluster.intra_gbps:g} Gbit/s in a node, {cluster.inter_gbps:g} Gbit/s between nodes; objective "
            f"{fc.objective}; {seconds:.1f} s")


def fit_command(args: argparse.Namespace, rest: list[str]) -> int:
    req, run = parse_request(rest)
    cluster = resolve_cluster(req.cluster)
    config = args.config or str(DEFAULT_CONFIG)
    cfg = load_config(config, run)
    base_args = ([] if args.config is None else ["--config", args.config]) + run
    t0 = time.perf_counter()
    with _progress() as tick:
        rows = fit(cfg, cluster, req.fit, tick)
    seconds = time.perf_counter() - t0
    if args.json:
        print(json.dumps(as_json(rows, cluster, req.fit, base_args, {"seconds": seconds})))
    else:
        print(markdown(rows, cluster, req.fit, base_args, header(cfg, cluster, req.fit, seconds)))
    if not any(r.fits for r in rows):
        print("no candidate fits: more workers, more memory per worker or a smaller batch", file=sys.stderr)
        return 1
    return 0


class _progress:
    """A progress bar on stderr (rich), one update per candidate scored."""

    def __enter__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("candidates"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("{task.description}"), console=Console(stderr=True), transient=True)
        self.bar.__enter__()
        self.task = self.bar.add_task("", total=None)

        def tick(name: str, done: int, total: int) -> None:
            self.bar.update(self.task, completed=done, total=total, description=name)

        return tick

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)


__all__ = ["fit_command", "parse_request", "FitRequest", "ConfigError"]
