"""``slimpar bench sdp``: SDP against DDP, DDP+AC, FSDP2 and FSDP2+AC, side by side in one run.

Rows follow the paper's claims (docs/methods.md, 'SDP claims'): block (B-SDP) and neuron (N-SDP) subnetworks with
forward masking, block subnetworks with backward masking (Bb-SDP), SDP with activation
checkpointing and with FSDP2; iteration-matched and FLOP-matched (1/keep more steps); two seeds for
the main rows. The ``virtual`` group times virtual SDP (one process, the quality benchmark's config)
against DDP, one worker after another and batched; the ``batch`` group times DDP and batched virtual SDP at 8, 16
and 32 sequences a step, for tokens/s. Every number comes from the rows' own ``summary.json``.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.report import commits_note, fmt, markdown_table, mean_spread, metadata, run_commits, write_json
from benchmarks.runner import Row, run_rows, select_rows
from benchmarks.timing import TIMING_STEPS, ratio_cell, step_time_ratios, summarize, timing_note, timing_rounds

LLAMA, RESNET, TINY = "configs/llama_small.toml", "configs/resnet18_fmnist.toml", "configs/llama_tiny.toml"
QUALITY = "configs/llama_quality.toml"
SDP = ["--parallel.mode", "sdp"]
AC = ["--train.activation_checkpointing", "true"]


def _sdp(level: str, keep: float, regime: str = "forward", extra: list[str] | None = None) -> list[str]:
    return [*SDP, "--sdp.level", level, "--sdp.keep", str(keep), "--sdp.regime", regime, *(extra or [])]


def llama_rows(config: str, steps: int, seeds: tuple[int, ...], group: str = "llama") -> list[Row]:
    base = ["--parallel.workers", "4", "--train.steps", str(steps)]
    main = {
        "DDP": ["--parallel.mode", "ddp"],
        "B-SDP 0.5": _sdp("block", 0.5),
        "N-SDP 0.5": _sdp("neuron", 0.5),
    }
    more = {
        "DDP+AC": ["--parallel.mode", "ddp", *AC],
        "FSDP2": ["--parallel.mode", "fsdp"],
        "FSDP2+AC": ["--parallel.mode", "fsdp", *AC],
        "B-SDP 0.75": _sdp("block", 0.75),
        "B-SDP 3/8": _sdp("block", 0.375),
        "N-SDP 0.75": _sdp("neuron", 0.75),
        "Bb-SDP 0.5": _sdp("block", 0.5, "backward"),
        "Bb-SDP 3/8": _sdp("block", 0.375, "backward"),
        "B-SDP 0.5+AC": _sdp("block", 0.5, extra=AC),
        "B-SDP 0.5+FSDP2+AC": _sdp("block", 0.5, extra=["--sdp.fsdp", "2", *AC]),
        "B-SDP 0.5+FSDP2(holders)+AC": _sdp("block", 0.5, extra=["--sdp.holder_shard", "true", *AC]),
        "B-SDP 0.5 FLOP-matched": _sdp("block", 0.5, extra=["--sdp.flop_matched", "true"]),
        "N-SDP 0.5 FLOP-matched": _sdp("neuron", 0.5, extra=["--sdp.flop_matched", "true"]),
    }
    rows = [Row(n, config, base + o, group, seeds[0]) for n, o in {**main, **more}.items()]
    rows += [Row(n, config, base + o, group, s) for n, o in main.items() for s in seeds[1:]]
    return rows


def resnet_rows(steps: int) -> list[Row]:
    base = ["--parallel.workers", "4", "--train.steps", str(steps)]
    recal = ["--sdp.bn_recalibrate", "20"]  # the full model's BatchNorm statistics re-estimated before eval
    rows = {"DDP": ["--parallel.mode", "ddp"], "B-SDP 0.5": _sdp("block", 0.5), "N-SDP 0.5": _sdp("neuron", 0.5),
            "Bb-SDP 0.5": _sdp("block", 0.5, "backward"), "B-SDP 0.5 + BN recal": _sdp("block", 0.5, extra=recal),
            "N-SDP 0.5 + BN recal": _sdp("neuron", 0.5, extra=recal)}
    return [Row(n, RESNET, base + o, "resnet") for n, o in rows.items()]


VIRTUAL_STEPS = 40  # its steps take ~0.1 s: a median over few of them moves with every hiccup of the machine


def virtual_rows(steps: int) -> list[Row]:
    """What a step of virtual SDP costs against DDP in one process (issue 20, item 2), on ``bench quality``'s
    config and its one thread per run: 4 simulated workers one after another, or batched in one pass over one
    model copy. At least ``VIRTUAL_STEPS`` steps per run, timing reruns included."""
    virtual = [*SDP, "--sdp.virtual", "true", "--sdp.virtual_workers", "4", "--sdp.level", "block",
               "--sdp.keep", "0.5"]
    rows = {"DDP": [], "virtual B-SDP 0.5": virtual,
            "virtual B-SDP 0.5 batched": [*virtual, "--sdp.virtual_batched", "true"]}
    base = ["--model.n_layers", "8", "--train.steps", str(max(steps, VIRTUAL_STEPS))]
    return [Row(n, QUALITY, base + o, "virtual", timing_steps=VIRTUAL_STEPS, env={"OMP_NUM_THREADS": "1"})
            for n, o in rows.items()]


BATCHES = (8, 16, 32)  # sequences of 64 tokens a step: bench quality's 8, then twice and four times as many


def batch_rows(steps: int) -> list[Row]:
    """Whether larger batches raise tokens/s on CPU (issue 20, item 2): DDP and batched virtual B-SDP 0.5 on
    ``bench quality``'s config and its one thread per run, at 8, 16 and 32 sequences a step. Timed like the
    virtual group; the report gives each row's tokens/s against DDP at 8 sequences (the row named "DDP")."""
    batched = [*SDP, "--sdp.virtual", "true", "--sdp.virtual_workers", "4", "--sdp.level", "block",
               "--sdp.keep", "0.5", "--sdp.virtual_batched", "true"]
    base = ["--model.n_layers", "8", "--train.steps", str(max(steps, VIRTUAL_STEPS))]
    rows = []
    for name, opts in (("DDP", []), ("virtual B-SDP 0.5 batched", batched)):
        for b in BATCHES:
            label = name if b == BATCHES[0] else f"{name} at batch {b}"
            rows.append(Row(label, QUALITY, base + opts + ["--train.batch_size", str(b)], "batch",
                            timing_steps=VIRTUAL_STEPS, env={"OMP_NUM_THREADS": "1"}))
    return rows


def tokens_per_s_vs_ddp(line: dict, ddp: dict | None, ratio: dict | None) -> dict | None:
    """Tokens/s against the group's DDP row per timing round: (tokens a step / DDP's) / (step time / DDP's),
    as median [range] over the rounds (the keys ``ratio_cell`` reads)."""
    if not ddp or not ratio or not line.get("tokens_per_step") or not ddp.get("tokens_per_step"):
        return None
    scale = line["tokens_per_step"] / ddp["tokens_per_step"]
    return summarize([scale / r for r in ratio.get("ratio", []) if r], "ratio")


def batch_markdown(lines: list[dict]) -> str:
    """The batch group: step time and tokens/s of each row against DDP at 8 sequences a step, and each SDP row's
    step time against DDP at its own batch size (the issue's cost target compares steps of equal batches)."""
    batch = [ln for ln in lines if ln["group"] == "batch"]
    body = [[ln["row"], str(ln["tokens_per_step"]), fmt(ln["step_time_s"], 3), ratio_cell(ln.get("step_time")),
             ratio_cell(same_batch_ratio(ln, batch)), fmt(ln.get("tokens_per_s"), 0),
             ratio_cell(ln.get("tokens_per_s_vs_ddp"))] for ln in batch]
    return markdown_table(["run (one process, one thread)", "tokens a step", "step time (s)",
                           "step time × DDP, median [range]", "× DDP at the same batch, median [range]",
                           "tokens/s", "tokens/s × DDP, median [range]"], body)


def same_batch_ratio(line: dict, batch: list[dict]) -> dict | None:
    """A batch-group SDP row's step time over DDP's at the same batch size, per timing round (the rounds run
    the rows interleaved, so round i of both is paired), as median [range]; None for the DDP rows."""
    if line["row"].startswith("DDP") or not line.get("step_time"):
        return None
    suffix = line["row"].partition(" at batch ")[2]
    ddp = next((ln for ln in batch if ln["row"] == ("DDP" + (f" at batch {suffix}" if suffix else ""))), None)
    if not ddp or not ddp.get("step_time"):
        return None
    mine, base = line["step_time"]["step_time_s"], ddp["step_time"]["step_time_s"]
    return summarize([a / b for a, b in zip(mine, base, strict=True) if a and b], "ratio")


def quick_rows() -> list[Row]:
    # the harness end to end; FSDP2's and N-SDP's accounting is checked in tests/distributed already
    base = ["--parallel.workers", "4", "--train.steps", "6", "--eval.batches", "1", "--data.ood", "none",
            "--checkpoint.export", "false", "--checkpoint.final", "false"]
    rows = {"DDP": ["--parallel.mode", "ddp"], "B-SDP 0.5": _sdp("block", 0.5),
            "Bb-SDP 0.5": _sdp("block", 0.5, "backward")}
    return [Row(n, TINY, base + o, "llama-tiny") for n, o in rows.items()]


# per-rank bytes from summary.json: modelled sent/received (mean and max over ranks), measured wire max
BYTES_PER_RANK = ("comm_bytes_sent_per_step_mean", "comm_bytes_sent_per_step_max", "comm_bytes_recv_per_step_mean",
                  "comm_bytes_recv_per_step_max", "wire_bytes_per_step_max")
BYTES_NOTE = ("\n\nBytes: *into collectives* is the mean over workers of the bytes each fed into collectives and sends "
              "(a broadcast counted at its root only; the figure committed before max sent/received were reported). "
              "*Max sent* and *max received* are the largest over workers of the bytes sent and received under gloo's "
              "algorithms (ring all-reduce 2(k-1)/k each way, binomial-tree broadcast; docs/outputs.md), so a worker "
              "that sends more than the mean shows here.\n")


def aggregate(results: list[dict]) -> list[dict]:
    """One line per (group, row): mean and spread over seeds, ratios to the group's DDP row."""
    lines: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        lines.setdefault((r["group"], r["row"]), []).append(r)
    ddp = {g: runs for (g, name), runs in lines.items() if name == "DDP"}
    out = []
    for (group, name), runs in lines.items():
        out.append(_line(group, name, runs, ddp.get(group)))
    return out


def _m(runs: list[dict], key: str):
    return mean_spread([r["summary"].get(key) for r in runs])[0]


def _line(group: str, name: str, runs: list[dict], ddp: list[dict] | None) -> dict:
    s0 = runs[0]["summary"]
    val, spread = mean_spread([r["summary"].get("val_loss") for r in runs])
    line = {"group": group, "row": name, "seeds": [r["seed"] for r in runs], "val_loss": val, "val_loss_spread": spread,
            "val_bits_per_byte": _m(runs, "val_bits_per_byte"), "val_accuracy": _m(runs, "val_accuracy"),
            "val_wikipedia_loss": _m(runs, "val_wikipedia_loss"), "peak_mem_bytes": _m(runs, "peak_mem_bytes"),
            "mem_breakdown": s0.get("mem_breakdown"), "comm_bytes_per_step": _m(runs, "comm_bytes_per_step"),
            "wire_bytes_per_step": _m(runs, "wire_bytes_per_step"), "step_time_s": _m(runs, "step_time_s"),
            **{key: _m(runs, key) for key in BYTES_PER_RANK},
            "steps": s0.get("steps"), "plan_floor_bytes": _plan_floor(s0), "spectral_gap": _plan(s0, "spectral_gap"),
            "tokens_per_s": _m(runs, "tokens_per_s"), "tokens_per_step": _tokens_per_step(s0),
            "command": runs[0]["command"]}
    if ddp:
        for key in ("peak_mem_bytes", "comm_bytes_per_step", "step_time_s", "comm_bytes_sent_per_step_max",
                    "comm_bytes_recv_per_step_max"):
            base = _m(ddp, key)
            line[f"{key}_vs_ddp"] = line[key] / base if base and line[key] is not None else None
    return line


def _tokens_per_step(summary: dict) -> int | None:
    """Tokens (or images) a step: the trainer's ``tokens_per_s`` is exactly that over ``step_time_s``."""
    rate, step = summary.get("tokens_per_s"), summary.get("step_time_s")
    return round(rate * step) if rate and step else None


def _plan_floor(summary: dict):
    ranks = summary.get("per_rank") or []
    vals = [r.get("analytic_bytes") for r in ranks if r and r.get("analytic_bytes") is not None]
    return sum(vals) / len(vals) if vals else None


def _plan(summary: dict, key: str):
    return (summary.get("sdp_plan") or {}).get(key)


def mib(b) -> str:
    return fmt(b / 2**20, 2) if b is not None else "–"


def report_markdown(lines: list[dict], meta: dict) -> str:
    headers = ["group", "row", "steps", "val loss (± over seeds)", "bits/byte or acc", "peak mem / worker (MiB)",
               "× DDP", "bytes into collectives / step / worker, mean (MiB)", "× DDP", "max sent / worker (MiB)",
               "× DDP", "max received / worker (MiB)", "× DDP", "plan floor (MiB)", "step time (s)",
               "× DDP, median [range] over rounds", "ρ"]
    rows = []
    for ln in lines:
        val = fmt(ln["val_loss"], 4) + (f" ± {ln['val_loss_spread']:.4f}" if ln["val_loss_spread"] else "")
        quality = fmt(ln["val_bits_per_byte"], 4) if ln["val_bits_per_byte"] else fmt(ln["val_accuracy"], 4)
        rows.append([ln["group"], ln["row"], str(ln["steps"]), val, quality, mib(ln["peak_mem_bytes"]),
                     fmt(ln.get("peak_mem_bytes_vs_ddp"), 2), mib(ln["comm_bytes_per_step"]),
                     fmt(ln.get("comm_bytes_per_step_vs_ddp"), 2), mib(ln.get("comm_bytes_sent_per_step_max")),
                     fmt(ln.get("comm_bytes_sent_per_step_max_vs_ddp"), 2), mib(ln.get("comm_bytes_recv_per_step_max")),
                     fmt(ln.get("comm_bytes_recv_per_step_max_vs_ddp"), 2), mib(ln["plan_floor_bytes"]),
                     fmt(ln["step_time_s"], 3), ratio_cell(ln.get("step_time")), fmt(ln["spectral_gap"], 3)])
    head = (f"# slimpar bench sdp\n\nMeasured {meta['date']} on {meta['machine']} ({meta['cpus']} CPUs), commit "
            f"`{meta['git_commit']}`, torch {meta['versions']['torch']}. Every row is a `slimpar train` run with "
            "4 local gloo workers on this machine (the virtual group's: one process simulating them), measured side "
            "by side in one benchmark run.\n\n")
    long = sorted({ln["group"] for ln in lines} & {"virtual", "batch"})  # their rows time VIRTUAL_STEPS steps
    steps = f"{TIMING_STEPS} ({' and '.join(long)} groups: {VIRTUAL_STEPS})" if long else TIMING_STEPS
    timing = timing_note(meta["timing"], meta["timing_rounds"], steps) if meta.get("timing") else ""
    untimed = sorted({ln["group"] for ln in lines} - {lines[0]["group"], "virtual", "batch"})
    if timing and untimed:
        timing += f"The timing rounds did not run for the {', '.join(untimed)} rows: they show one run's ratio.\n"
    if any(ln["group"] == "batch" for ln in lines):
        timing += f"\nBatch size (the batch group; DDP is the row at 8 sequences a step):\n\n{batch_markdown(lines)}\n"
    cmds = "\n".join(f"- {ln['row']} ({ln['group']}): `{ln['command']}`" for ln in lines)
    table = markdown_table(headers, rows)
    return head + commits_note(meta) + table + BYTES_NOTE + timing + "\nCommands:\n\n" + cmds + "\n"


def bench_sdp(out: Path, quick: bool, steps: int = 100, only: set[str] | None = None, jobs: int = 1,
              rounds: int = 2, links: bool = True, seeds: tuple[int, ...] = (0, 1)) -> dict:
    """The rows (``seeds`` for the main ones), then ``rounds`` interleaved timing rounds (benchmarks/timing.py),
    then DDP and B-SDP 0.5 over throttled links unless ``links`` is False."""
    from benchmarks.network.throttled import run_throttled, throttled_markdown

    rows = (quick_rows() if quick else llama_rows(LLAMA, steps, seeds) + resnet_rows(steps) + virtual_rows(steps)
            + batch_rows(steps))
    rows = select_rows(rows, only)
    out.mkdir(parents=True, exist_ok=True)
    results = run_rows(rows, out, jobs)
    # timing rounds for the first group (the LLaMA rows whose step times the README compares) and for virtual
    # SDP's cost
    timed = (rows[0].group, "virtual", "batch")
    timings = timing_rounds([r for r in rows if r.seed == seeds[0] and r.group in timed], rounds, out)
    ratios = step_time_ratios(results, timings, "DDP")
    lines = aggregate(results)
    ddp = {ln["group"]: ln for ln in lines if ln["row"] == "DDP"}
    for ln in lines:
        ln["step_time"] = ratios.get((ln["group"], ln["row"]))
        ln["tokens_per_s_vs_ddp"] = tokens_per_s_vs_ddp(ln, ddp.get(ln["group"]), ratios.get((ln["group"], ln["row"])))
    meta = metadata({"quick": quick, "steps": None if quick else steps, "timing_rounds": rounds,
                     "run_commits": run_commits(results + timings)})
    meta["timing"] = {f"{g}/{n}": v for (g, n), v in ratios.items()} if rounds else None
    first = rows[0].group
    linked = [r for r in rows if r.group == first and r.name in ("DDP", "B-SDP 0.5") and r.seed == rows[0].seed]
    base = {r["row"]: r["summary"] for r in results if r["group"] == first and r["seed"] == rows[0].seed}
    throttled = (run_throttled(linked, [100.0] if quick else [1000.0, 100.0], out, 4, base, prefix="spls")
                 if links else [])
    data = {"meta": meta, "lines": lines, "throttled": throttled, "runs": results, "timing_runs": timings}
    write_json(out / "results.json", data)
    links_md = throttled_markdown(throttled, "DDP") if links else ""
    (out / "report.md").write_text(report_markdown(lines, meta) + links_md)
    from benchmarks.plots import sdp_plots

    sdp_plots(lines, results, out)
    return data
