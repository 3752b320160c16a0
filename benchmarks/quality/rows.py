"""The runs of ``slimpar bench quality`` (benchmarks/quality/harness.py): every group's rows, their commands and seeds.

Groups (``config`` llama_quality.toml: d = 128, 1024-token BPE, 2,000 steps of 8 x 64 tokens). With no
``--rows`` the benchmark runs its core set, ``CORE``: ``lr-sweep``, ``tuned``, ``sdp-lr-sweep`` and ``sdp-tuned``
(every row at its own learning rate, matched bytes; about 2.2 h at 2 runs a time on 2 cores). Every other group
runs when ``--rows`` names it; ``--rows one-rate`` names the six groups of issue 10's benchmark, which run every
row at one learning rate (``GROUPS``):

- ``sdp``: 8 blocks. DDP is one process on the same global batch (DDP's averaged gradient is the
  gradient of the global batch). B-SDP 0.5 and 3/8, N-SDP 0.5, Bb-SDP 0.5 and 3/8, FLOP-matched B-SDP 0.5.
- ``mapl``: 4 blocks in 4 stages (one block per stage). The codecs of ``bench mapl`` and the projector
  ablations of issue 10, plus MAPL 16x without RVQ (RVQ's own cost) and the four projector changes at 8x
  and 16x + RVQ; those with a rank divide the payload (r = d / K, ``bench mapl``'s pin). "MAPL 4x of every byte
  (default)" is slimpar's default MAPL 4x since K counts every byte (``MAPL_DEFAULT``). The schedule is GPipe
  with one micro-batch: in one process a schedule only orders the same computations, and one micro-batch is the
  fastest.
- ``mapl-deep``: the all-boundary variant closer to the paper: 8 blocks, 2 per stage.
- ``mapl-lr1e-3``: the main pipeline comparisons again at learning rate 1e-3 instead of 2e-3.
- ``resnet``: ResNet-18 at width 16 on Fashion-MNIST for 3 epochs (width 64 takes 2.7 s a step here).
- ``rvq-update``: MAPL 16x + RVQ with the codebook EMA applied
  every microbatch, every 2 and every 4 steps, for RVQ's bytes against its quality (issue 20, item 6).
- ``anchor-form``: MAPL 4x and 16x + RVQ with all changes, their factorized anchors symmetric (gradient
  rows exchanged every step) or receiver-only (no exchange), for the anchors' bytes (issue 20, item 5).
- ``lr-sweep`` (core): none, SSN 4x, MAPL 4x (all changes, receiver anchors), naive 4x and int8 at
  learning rates 5e-4 to 4e-3, one seed; the projecting codecs at matched total bytes
  (``--pipeline.compression_of total``) with token ids read locally (issue 20, item 1).
- ``tuned`` (core, after ``lr-sweep``): the same rows, 3 seeds, each at its best rate of the sweep.
- ``sdp-lr-sweep`` and ``sdp-tuned`` (core): the same for DDP, B-SDP 0.5 (iteration- and FLOP-matched),
  Bb-SDP 0.5 and 3/8, the SDP rows batched (``sdp.virtual_batched``).
- ``length`` (after both sweeps): LENGTH_ROWS at 2,000 to 32,000 steps (16x in tokens, up to 16 and 10
  tokens per parameter), 3 seeds (at the longest, 2 where their gaps' spread is under a quarter of the gap:
  ``third_seed``), each row at its tuned rate; the report fits each gap against log tokens.
- ``width`` (after ``lr-sweep``): none, SSN 4x and MAPL 4x at d = 64, 128 and 256, equal tokens per
  parameter; the report fits each gap against log parameters and extrapolates it to the paper's 150M.
- ``unseen-config``: none, SSN 4x and MAPL 4x with the defaults before issue 20 and with the candidate ones,
  at matched bytes, on a config no other row uses (6 blocks in 3 stages, 4 x 128 tokens a step; item 5).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.mapl import ROWS as CODECS
from benchmarks.quality.trends import LENGTHS, WIDTHS, baseline_name, settled, split_name, width_params
from benchmarks.runner import Row

CONFIG = "configs/llama_quality.toml"
SEEDS = (0, 1, 2)
STEPS = 2000
SDP = ["--model.n_layers", "8", "--parallel.mode", "sdp", "--sdp.virtual", "true", "--sdp.virtual_workers", "4"]
PIPE = ["--parallel.mode", "pipeline", "--pipeline.virtual", "true", "--pipeline.stages", "4",
        "--model.tie_embeddings", "false", "--pipeline.schedule", "gpipe", "--pipeline.microbatches", "1"]


def _sdp(level: str, keep: float, regime: str = "forward", *extra: str) -> list[str]:
    return [*SDP, "--sdp.level", level, "--sdp.keep", str(keep), "--sdp.regime", regime, *extra]


SDP_ROWS = {
    "DDP": ["--model.n_layers", "8"],
    "B-SDP 0.5": _sdp("block", 0.5),
    "B-SDP 0.5 FLOP-matched": _sdp("block", 0.5, "forward", "--sdp.flop_matched", "true"),
    "Bb-SDP 3/8": _sdp("block", 0.375, "backward"),
    "B-SDP 3/8": _sdp("block", 0.375),
    "N-SDP 0.5": _sdp("neuron", 0.5),
    "Bb-SDP 0.5": _sdp("block", 0.5, "backward"),
}
MAPL_MAIN = ("none", "MAPL 4x", "SSN 4x", "naive 4x", "MAPL 4x + all changes", "MAPL 8x", "SSN 8x",
             "MAPL 16x + RVQ", "int8", "bf16", "MAPL 4x + anchors")
MAPL_ABLATIONS = ("MAPL 4x + PCA init", "MAPL 4x + own SPEL schedule", "MAPL 4x + separate clip",
                  "MAPL 4x + zero anchors", "MAPL 4x + PCA + frozen after N", "MAPL 16x (no RVQ)",
                  "MAPL 8x + all changes", "MAPL 16x + RVQ + all changes", "MAPL 16x + all changes (no RVQ)",
                  "MAPL 16x + RVQ + all changes - commitment")
# how often RVQ's codebook EMA is applied (issue 20, item 6): bytes against quality. With one microbatch a step
# "every microbatch" is every step, the behaviour before the update window existed
RVQ_UPDATE = ("MAPL 16x + RVQ (EMA every microbatch)", "MAPL 16x + RVQ (EMA every 2 steps)",
              "MAPL 16x + RVQ (EMA every 4 steps)")
# the anchors' form (issue 20, item 5): symmetric tables exchange their gradient rows, receiver-only ones nothing
ANCHOR_FORM = ("MAPL 4x + all changes", "MAPL 4x + all changes (receiver anchors)", "MAPL 16x + RVQ + all changes",
               "MAPL 16x + RVQ + all changes (receiver anchors)")
DEEP = ("none", "SSN 4x", "MAPL 4x", "MAPL 4x + all changes")
# the main comparisons again at half the learning rate: 2e-3 is too high for the most compressed rows
# (docs/results/quality/diagnostics), so this group tests whether the rows' order depends on it
HALF_LR = ("none", "SSN 4x", "MAPL 4x + all changes", "SSN 8x", "MAPL 8x + all changes",
           "MAPL 16x + all changes (no RVQ)", "MAPL 16x + RVQ + all changes")
# ResNet-18 (CIFAR stem) at width 16: 3 epochs of Fashion-MNIST's 60,000 images at batch 64
RESNET = ["--model.width", "16", "--train.steps", "2813", "--eval.every", "-1", "--eval.batches", "50",
          "--eval.batch_size", "200", "--checkpoint.every", "500", "--checkpoint.keep_last", "1",
          "--checkpoint.export", "false", "--checkpoint.final", "false", "--log.every", "25",
          "--log.progress", "false", "--parallel.workers", "1"]
RESNET_ROWS = {
    "DDP": ["--parallel.mode", "single"],
    "B-SDP 0.5": ["--parallel.mode", "sdp", "--sdp.virtual", "true", "--sdp.keep", "0.5",
                  "--sdp.bn_recalibrate", "20"],
    "N-SDP 0.5": ["--parallel.mode", "sdp", "--sdp.virtual", "true", "--sdp.level", "neuron", "--sdp.keep", "0.5",
                  "--sdp.bn_recalibrate", "20"],
}
# issue 20, item 1: each compared row at its own learning rate, the projecting codecs at matched total bytes
# (compression_of total: every byte a boundary sends <= 1/4 of none's, each way) and token ids read locally
# (in slimpar's pipelines every stage reads the batch). A sweep group runs each row at every rate of LRS, one
# seed; its tuned group runs 3 seeds at each row's best rate of the sweep (seed 0 is the sweep's run at that rate)
LRS = ("5e-4", "1e-3", "2e-3", "4e-3")
_MATCHED = ("--pipeline.compression_of", "total", "--pipeline.ids", "local")
_PIPE4 = ["--model.n_layers", "4", *PIPE]
# every option these rows depend on is spelled out (not taken from bench mapl's rows or from the defaults), so
# their commands keep their meaning when a default changes; the ones before issue 20 pinned in the "defaults
# before issue 20" row, the best 4x options measured so far (all changes: docs/results/quality; receiver-only anchors:
# docs/results/anchor_form) in MAPL's
_CODEC4 = ("--pipeline.compression", "4")
_MAPL_BEFORE = ("--pipeline.codec", "mapl", *_CODEC4, "--pipeline.projector_init", "pca", "--pipeline.spel_schedule",
                "model", "--pipeline.spel_lr", "0.01", "--pipeline.clip_projector", "global", "--pipeline.anchors",
                "none")
_MAPL_BEST = ("--pipeline.codec", "mapl", *_CODEC4, "--pipeline.projector_init", "pca", "--pipeline.spel_schedule",
              "constant", "--pipeline.spel_lr", "0.001", "--pipeline.clip_projector", "separate", "--pipeline.anchors",
              "factorized", "--pipeline.anchor_init", "zero", "--pipeline.anchor_form", "receiver")
# the mapl group's MAPL 4x at slimpar's defaults once compression K meant every byte (compression_of total): the
# flags of the tuned group's MAPL 4x (receiver anchors, which start at zero whatever anchor_init says; ids read
# locally), r = 29 here, at the group's one rate. Its final evaluation is the other mapl rows': they ran before
# llama_quality.toml read 262k tokens at the end (eval.final_tokens), so it reads eval.batches as they did
MAPL_DEFAULT = {"MAPL 4x of every byte (default)": [*_MAPL_BEST, *_MATCHED, "--eval.final_tokens", "0"]}
TUNED = {
    "none": [*_PIPE4, "--pipeline.codec", "none", *_CODEC4],
    "SSN 4x": [*_PIPE4, "--pipeline.codec", "ssn", *_CODEC4, *_MATCHED],
    "MAPL 4x": [*_PIPE4, *_MAPL_BEST, *_MATCHED],
    "naive 4x": [*_PIPE4, "--pipeline.codec", "naive", *_CODEC4, *_MATCHED],
    "int8": [*_PIPE4, "--pipeline.codec", "int8", *_CODEC4],
}
# the SDP rows batched (sdp.virtual_batched: all simulated workers in one pass, equal to rounding)
SDP_TUNED = {"DDP": SDP_ROWS["DDP"], **{n: [*SDP_ROWS[n], "--sdp.virtual_batched", "true"]
                                        for n in ("B-SDP 0.5", "B-SDP 0.5 FLOP-matched", "Bb-SDP 0.5", "Bb-SDP 3/8")}}
SWEEPS = {"lr-sweep": ("tuned", TUNED), "sdp-lr-sweep": ("sdp-tuned", SDP_TUNED)}  # sweep -> (tuned group, rows)
# each sweep's rates: DDP was still improving at 4e-3 (docs/results/tuned), so the SDP sweep goes one rate further
SWEEP_RATES = {"lr-sweep": LRS, "sdp-lr-sweep": (*LRS, "8e-3")}
# issue 20, item 5: the candidate MAPL defaults on a config no other row uses (6 blocks in 3 stages, 128-token
# sequences, 4 a step): MAPL at matched bytes must end at or below SSN
_UNSEEN = ["--model.n_layers", "6", "--data.seq_len", "128", "--train.batch_size", "4", "--parallel.mode", "pipeline",
           "--pipeline.virtual", "true", "--pipeline.stages", "3", "--model.tie_embeddings", "false",
           "--pipeline.schedule", "gpipe", "--pipeline.microbatches", "1"]
UNSEEN = {
    "none": [*_UNSEEN, "--pipeline.codec", "none", *_CODEC4],
    "SSN 4x": [*_UNSEEN, "--pipeline.codec", "ssn", *_CODEC4, *_MATCHED],
    "MAPL 4x (defaults before issue 20)": [*_UNSEEN, *_MAPL_BEFORE, *_MATCHED],
    "MAPL 4x (all changes + receiver anchors)": [*_UNSEEN, *_MAPL_BEST, *_MATCHED],
}
# issue 20, item 3: the gap against training length (quality_trends.LENGTHS), each row at its tuned rate, 3 seeds (its
# 2,000 steps are the tuned group's runs). 32,000 steps are 16.4M tokens: 16 tokens per parameter for the 4-block
# pipeline, 10 for SDP
LENGTH_ROWS = ("none", "int8", "SSN 4x", "MAPL 4x", "naive 4x", *SDP_TUNED)
# issue 20, item 4: none, SSN 4x and MAPL 4x at d = 64, 128 and 256 (4 blocks in 4 stages: quality_trends.WIDTHS),
# each at the tokens per parameter of 2,000 steps at d = 128 (1.02) and at its rate tuned at d = 128
WIDTH_ROWS = ("none", "SSN 4x", "MAPL 4x")
# issue 10's benchmark, every row at one learning rate: runs when --rows names a group, or all as "one-rate"
GROUPS = ("mapl", "sdp", "mapl-ablations", "mapl-deep", "mapl-lr1e-3", "resnet")
ALIASES = {"one-rate": GROUPS}
# what runs without --rows: the sweeps and the tuned rows (about 2.2 h at 2 runs at a time on 2 cores)
CORE = ("lr-sweep", "tuned", "sdp-lr-sweep", "sdp-tuned")
# the groups besides GROUPS; each runs only when --rows (or CORE, by default) names it
OPT_IN = ("rvq-update", "anchor-form", "lr-sweep", "tuned", "sdp-lr-sweep", "sdp-tuned", "unseen-config", "length",
          "width")


def _codec(name: str, steps: int) -> list[str]:
    return [a.format(freeze=str(max(steps // 10, 1))) for a in CODECS[name]]


def sweep_name(row: str, lr: str) -> str:
    return f"{row} at lr {lr}"


def best_rates(out: Path, sweep: str = "lr-sweep") -> dict[str, str]:
    """Each row of ``sweep``'s learning rate with the lowest final validation loss (Shakespeare) in the sweep's
    finished runs under ``out`` (recorded_losses); a row enters once every rate of its sweep (``SWEEP_RATES``) has
    finished."""
    got = recorded_losses(out, sweep, [Row(sweep_name(n, lr), CONFIG, group=sweep) for n in SWEEPS[sweep][1]
                                       for lr in SWEEP_RATES[sweep]])
    best = {}
    for name in SWEEPS[sweep][1]:
        losses = {lr: got[(sweep_name(name, lr), 0)] for lr in SWEEP_RATES[sweep] if (sweep_name(name, lr), 0) in got}
        if len(losses) == len(SWEEP_RATES[sweep]):
            best[name] = min(losses, key=losses.get)
    return best


def recorded_runs(out: Path) -> list[dict]:
    """The runs the results.json under ``out`` records (none without one)."""
    path = out / "results.json"
    return json.loads(path.read_text()).get("runs", []) if path.exists() else []


def recorded_losses(out: Path, group: str, runs: list[Row]) -> dict[tuple[str, int], float]:
    """(row, seed) -> final val loss of ``group``'s finished runs under ``out``: those the results.json there
    recorded (a new machine starts from that record alone: run folders are not committed), and ``runs`` whose
    folders hold a summary."""
    got = {(r["row"], r["seed"]): r["summary"].get("val_loss") for r in recorded_runs(out) if r["group"] == group}
    for row in runs:
        if (summary := out / "runs" / row.key / "summary.json").exists():
            got[(row.name, row.seed)] = json.loads(summary.read_text()).get("val_loss")
    return {k: v for k, v in got.items() if v is not None}


def rows(steps: int = STEPS, seeds: tuple[int, ...] = SEEDS, groups: tuple[str, ...] = GROUPS,
         extra: tuple[str, ...] = (), sweep_dir: Path | None = None) -> list[Row]:
    """Every run in the order it runs: the claims' main rows first, all seeds of a row together. The ``tuned``
    rows take their rates from the finished sweep under ``sweep_dir`` (rows whose sweep has not finished: none)."""
    base = ["--train.steps", str(steps), *extra]
    plan: list[tuple[str, str, list[str]]] = []
    mapl = [("mapl", n, ["--model.n_layers", "4", *PIPE, *_codec(n, steps)]) for n in MAPL_MAIN]
    sdp = [("sdp", n, o) for n, o in SDP_ROWS.items()]
    if "mapl" in groups:
        plan += mapl[:4]
    if "sdp" in groups:
        plan += sdp[:4]
    if "mapl" in groups:
        plan += mapl[4:] + [("mapl", n, ["--model.n_layers", "4", *PIPE, *o]) for n, o in MAPL_DEFAULT.items()]
    if "sdp" in groups:
        plan += sdp[4:]
    if "mapl-ablations" in groups:
        plan += [("mapl", n, ["--model.n_layers", "4", *PIPE, *_codec(n, steps)]) for n in MAPL_ABLATIONS]
    if "mapl-deep" in groups:
        plan += [("mapl-deep", n, ["--model.n_layers", "8", *PIPE, *_codec(n, steps)]) for n in DEEP]
    for group, names in (("rvq-update", RVQ_UPDATE), ("anchor-form", ANCHOR_FORM)):
        if group in groups:
            plan += [(group, n, ["--model.n_layers", "4", *PIPE, *_codec(n, steps)]) for n in names]
    for sweep, (_, named) in SWEEPS.items():
        if sweep in groups:
            plan += [(sweep, sweep_name(n, lr), [*o, "--train.lr", lr]) for n, o in named.items()
                     for lr in SWEEP_RATES[sweep]]
    if "unseen-config" in groups:
        plan += [("unseen-config", n, o) for n, o in UNSEEN.items()]
    if "mapl-lr1e-3" in groups:
        plan += [("mapl-lr1e-3", n, ["--model.n_layers", "4", *PIPE, *_codec(n, steps), "--train.lr", "1e-3"])
                 for n in HALF_LR]
    out = [Row(name, CONFIG, base + o, group, s) for group, name, o in plan
           for s in (seeds[:1] if group in SWEEPS else seeds)]
    out += _rate_rows(steps, seeds, groups, sweep_dir, base)
    if "resnet" in groups:
        out += [Row(n, "configs/resnet18_fmnist.toml", RESNET + o + list(extra), "resnet", s)
                for n, o in RESNET_ROWS.items() for s in seeds]
    return out


def quick_rows() -> list[Row]:
    """The harness end to end in under a minute: two SDP and two pipeline rows, 2 seeds, 8 steps."""
    extra = ("--eval.every", "4", "--log.every", "2", "--eval.batches", "1", "--checkpoint.every", "0",
             "--data.ood", "wikipedia")
    picked = {("sdp", "DDP"), ("sdp", "B-SDP 0.5"), ("mapl", "none"), ("mapl", "MAPL 4x + all changes")}
    return [r for r in rows(8, (0, 1), ("mapl", "sdp", "mapl-ablations"), extra) if (r.group, r.name) in picked]


def _rate_rows(steps: int, seeds: tuple[int, ...], groups: tuple[str, ...], sweep_dir: Path | None,
               base: list[str]) -> list[Row]:
    """The rows that run at the rates the sweeps under ``sweep_dir`` found (a row whose sweep has not finished is
    left out): the tuned groups, the length sweep and the width sweep. A run with the same command as one of an
    earlier group carries that run's key in ``tags["same_as"]`` and reuses it."""
    rates = {sweep: best_rates(sweep_dir, sweep) if sweep_dir else {} for sweep in SWEEPS}
    out = []
    for sweep, (tuned, named) in SWEEPS.items():
        if tuned in groups:
            out += [Row(n, CONFIG, base + [*o, "--train.lr", lr], tuned, s,
                        tags={"lr": lr, "same_as": Row(sweep_name(n, lr), CONFIG, group=sweep).key} if s == 0 else
                        {"lr": lr}) for n, o in named.items() if (lr := rates[sweep].get(n)) for s in seeds]
    rate = {**rates["lr-sweep"], **rates["sdp-lr-sweep"]}
    named = {**TUNED, **SDP_TUNED}
    tuned_of = {n: SWEEPS[w][0] for w in SWEEPS for n in SWEEPS[w][1]}
    if "length" in groups:
        longest = longest_losses(sweep_dir) if sweep_dir else {}
        length = [Row(f"{n} at {k} steps", CONFIG, ["--train.steps", str(k), *named[n], "--train.lr", rate[n]],
                      "length", s, tags={"lr": rate[n], "steps": k, **_same(k == STEPS, n, tuned_of[n], s)})
                  for k in LENGTHS for n in LENGTH_ROWS if n in rate for s in seeds
                  if k < LENGTHS[-1] or s in seeds[:2] or third_seed(longest, n)]
        # a third seed at the longest length runs after every row's first two, also in a resumed sweep where the
        # two seeds of some rows have finished and those of others have not (a stable sort)
        out += sorted(length, key=lambda r: r.tags["steps"] == LENGTHS[-1] and r.seed not in seeds[:2])
    if "width" in groups:
        for size, d in WIDTHS.items():
            n_steps = round(STEPS * width_params(size) / width_params("mini"))
            sized = [] if size == "mini" else ["--model.size", size]
            out += [Row(f"{n} at d {d}", CONFIG, ["--train.steps", str(n_steps), *TUNED[n], *sized, "--train.lr",
                                                   rate[n]], "width", s,
                        tags={"lr": rate[n], "d": d, **_same(size == "mini", n, "tuned", s)})
                    for n in WIDTH_ROWS if n in rate for s in seeds]
    return out


def longest_losses(out: Path) -> dict[tuple[str, int], float]:
    """(row, seed) -> final val loss of the length sweep's finished runs at the longest length under ``out``
    (recorded_losses)."""
    at = f"{LENGTHS[-1]} steps"
    got = recorded_losses(out, "length", [Row(f"{n} at {at}", CONFIG, group="length", seed=s)
                                          for n in LENGTH_ROWS for s in SEEDS])
    return {(split_name(row)[0], seed): v for (row, seed), v in got.items() if split_name(row)[1] == at}


def third_seed(losses: dict[tuple[str, int], float], name: str) -> bool:
    """Whether ``name`` runs a third seed at the longest length: where its first two seeds' paired gaps to the
    baseline leave it unsettled (quality_trends.settled: their std above a quarter of their mean), and for a baseline
    (none, DDP) where any row compared with it does. ``losses``: longest_losses. Until both seeds and their
    baselines have finished: no (the benchmark asks again after them, in benchmarks/quality/harness.py's last phase)."""
    row = f"{name} at {LENGTHS[-1]} steps"
    if baseline_name(row) == row:
        return any(third_seed(losses, n) for n in LENGTH_ROWS
                   if n != name and baseline_name(f"{n} at {LENGTHS[-1]} steps") == row)
    base = split_name(baseline_name(row))[0]
    pairs = [(losses.get((name, s)), losses.get((base, s))) for s in SEEDS[:2]]
    if any(mine is None or ref is None for mine, ref in pairs):
        return False
    gaps = [mine / ref - 1 for mine, ref in pairs]
    return not settled(gaps, longest=True)


def _same(same: bool, name: str, group: str, seed: int) -> dict:
    return {"same_as": Row(name, CONFIG, group=group, seed=seed).key} if same else {}
