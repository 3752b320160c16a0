"""``slimpar plan --memory``: each worker's predicted peak memory, split into its parts, for the run a
config and its overrides describe, at any model size; nothing is allocated (slimpar.train.memory.predict)."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

from slimpar.config import DEFAULT_CONFIG, Config
from slimpar.train.memory.predict_pipeline import describe_pipeline, stage_label, value_sizes_text
from slimpar.train.modes import mode_of
from slimpar.train.validate.checks import load_run_config
from slimpar.utils import fmt_bytes

_COLUMNS = ("params", "grads", "optimizer", "activations", "peak_live")


def parse_ranks(text: str | None, world: int) -> list[int] | None:
    """``"0,3"`` -> [0, 3]; None -> None (every rank)."""
    if not text:
        return None
    ranks = [int(r) for r in text.split(",")]
    bad = [r for r in ranks if not 0 <= r < world]
    if bad:
        from slimpar.config import ConfigError

        raise ConfigError(f"--ranks: {bad} not in 0..{world - 1} (parallel.workers = {world})")
    return ranks


def _take_init_from(rest: list[str]) -> tuple[list[str], str]:
    """``rest`` without ``--model.init_from DIR`` (or ``=DIR``), and DIR ("" when absent)."""
    out, folder, i = [], "", 0
    while i < len(rest):
        if rest[i] == "--model.init_from" and i + 1 < len(rest):
            folder, i = rest[i + 1], i + 2
            continue
        if rest[i].startswith("--model.init_from="):
            folder = rest[i].split("=", 1)[1]
        else:
            out.append(rest[i])
        i += 1
    return out, folder


def describe(cfg: Config) -> str:
    """The workload a prediction assumes, in one line."""
    t, p = cfg.train, cfg.parallel
    if p.mode == "pipeline":
        return f"{describe_pipeline(cfg)} x seq {cfg.data.seq_len}, {t.dtype}, step {cfg.log.measure_step}"
    ac = " + AC" if t.activation_checkpointing else ""
    mode, per = mode_of(cfg).describe(cfg)
    items = f"x seq {cfg.data.seq_len}" if cfg.data.kind == "text" else f"images of {cfg.data.image_set}"
    return (f"{mode}{ac}, {p.workers} workers, global batch {t.batch_size} ({per} per worker) {items}, {t.dtype}, "
            f"step {cfg.log.measure_step}")


def memory_command(args: argparse.Namespace, rest: list[str]) -> int:
    from slimpar.train.memory.predict import predict_memory

    rest, init_from = _take_init_from(rest)  # the folder needs only its config.json here
    if init_from and not any(a.startswith("--model.max_seq_len") for a in rest):
        from slimpar.models.hf_llama import read_hf_config

        rest = [*rest, "--model.max_seq_len", str(read_hf_config(init_from, weights=False).max_seq_len)]
    # no machine-size check, and no data: a prediction needs the vocabulary's size only (slimpar.data.vocab)
    cfg = load_run_config(args.config or str(DEFAULT_CONFIG), rest, training=False, data=False)
    if init_from:
        cfg = replace(cfg, model=replace(cfg.model, init_from=init_from))
    t0 = time.perf_counter()
    rows = predict_memory(cfg, parse_ranks(args.ranks, cfg.parallel.workers))
    if args.json:
        print(json.dumps({"workload": describe(cfg), "per_rank": rows, "seconds": time.perf_counter() - t0}))
        return 0
    print(f"predicted memory per worker ({describe(cfg)}; FakeTensorMode, nothing allocated)")
    pipeline = cfg.parallel.mode == "pipeline"  # one stage per worker (all of them with pipeline.virtual)
    print("worker  " + ("holds               " if pipeline else "") + "  ".join(f"{c:>12}" for c in _COLUMNS))
    for r in rows:
        holds = f"{stage_label(cfg, r['rank']):<20}" if pipeline else ""
        print(f"{r['rank']:>6}  {holds}" + "  ".join(f"{fmt_bytes(r[c]):>12}" for c in _COLUMNS))
    if pipeline:
        print(f"value-dependent sizes: {value_sizes_text(cfg)} (docs/memory.md)")
    print("peak_live: parameters, gradients, optimizer state and buffers held at the step's start, plus the "
          f"largest sum of what the step allocates and holds at once ({time.perf_counter() - t0:.1f} s)")
    return 0
