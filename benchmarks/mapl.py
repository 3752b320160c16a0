"""``slimpar bench mapl``: compressed pipeline codecs side by side, token-matched, 4 stages.

Rows follow the paper's claims and baselines (docs/methods.md, 'MAPL claims' and 'Baselines'): the
uncompressed pipeline, bf16/int8 casts, the naive learned projector, SSN at 4x and 8x, MAPL at 4x and 8x,
MAPL with factorized and with full anchors, MAPL with A's gradient parts exchanged exactly (fp32 instead
of the default int8), and MAPL with residual VQ on projectors of rank d/16 and d/32 (the backward message
stays r floats, so those rows' backward ratio is 16x/32x while the forward payload is a few bytes of
packed indices per token).
Every row trains the same model on the same tokens for the same number of steps.

The projector ablations (issue 10, item 3) change one thing each against "MAPL 4x": the PCA start of
A, SPEL on its own constant η = 1e-3 (the step size the study measured after a PCA start) instead of
the model's warm-up + cosine at η = 0.01, A's gradient clipped on its own, factorized anchors that
start at zero (compare with "MAPL 4x + anchors"), and a PCA start frozen after 10% of the steps
(does learning A help at all?). "MAPL 4x + all changes" combines the first four (A keeps learning).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.report import COMPRESSION_NOTE, commits_note, fmt, markdown_table, metadata, run_commits, write_json
from benchmarks.runner import Row, run_rows, select_rows
from benchmarks.timing import ratio_cell, step_time_ratios, timing_note, timing_rounds

PIPE = ["--parallel.mode", "pipeline", "--parallel.workers", "4", "--pipeline.stages", "4",
        "--model.tie_embeddings", "false"]


# the settings these rows were measured with, where a default has changed since: A's random start (the default
# start became pca), and the SPEL step, clipping, anchors and id transport before issue 20 (docs/pipeline.md,
# "Defaults"); a row that names an option keeps its own. Each ablation row changes one thing against "MAPL 4x"
MEASURED_WITH = {"--pipeline.projector_init": "random", "--pipeline.spel_schedule": "model",
                 "--pipeline.spel_lr": "0.01", "--pipeline.clip_projector": "global", "--pipeline.anchors": "none",
                 "--pipeline.anchor_form": "symmetric"}


# the codecs with a rank were measured with r = d / K (the boundary payload divided by K), the default until
# pipeline.compression_of became "total" (every byte a boundary sends <= 1/K of none's)
PAYLOAD_MEANING = {"--pipeline.compression_of": "payload"}
PROJECTING = ("mapl", "ssn", "naive")


def _codec(kind: str, compression: int = 4, *extra: str) -> list[str]:
    pins = {**(MEASURED_WITH if kind == "mapl" else {}), **(PAYLOAD_MEANING if kind in PROJECTING else {})}
    pinned = [a for k, v in {**pins, "--pipeline.ids": "send"}.items() if k not in extra for a in (k, v)]
    return ["--pipeline.codec", kind, "--pipeline.compression", str(compression), *pinned, *extra]


RVQ = ("--pipeline.rvq.levels", "2", "--pipeline.rvq.codebook", "256")
ROWS = {  # in the order they run: the claims' main rows first, then the wider sweep and ablations
    "none": _codec("none"),
    "bf16": _codec("bf16"),
    "naive 4x": _codec("naive", 4),
    "SSN 4x": _codec("ssn", 4),
    "MAPL 4x": _codec("mapl", 4),
    "MAPL 4x (fp32 sync)": _codec("mapl", 4, "--pipeline.sync_dtype", "fp32"),
    "MAPL 16x + RVQ": _codec("mapl", 16, *RVQ),
    "int8": _codec("int8"),
    "SSN 8x": _codec("ssn", 8),
    "MAPL 8x": _codec("mapl", 8),
    "MAPL 4x + anchors": _codec("mapl", 4, "--pipeline.anchors", "factorized"),
    "MAPL 32x + RVQ": _codec("mapl", 32, *RVQ),
    "MAPL 4x + full anchors": _codec("mapl", 4, "--pipeline.anchors", "full"),
}
PCA = ("--pipeline.projector_init", "pca")
OWN_SPEL = ("--pipeline.spel_schedule", "constant", "--pipeline.spel_lr", "0.001")
SEPARATE_CLIP = ("--pipeline.clip_projector", "separate")
ZERO_ANCHORS = ("--pipeline.anchors", "factorized", "--pipeline.anchor_init", "zero")
ALL_CHANGES = (*PCA, *OWN_SPEL, *SEPARATE_CLIP, *ZERO_ANCHORS)  # A keeps learning
ROWS.update({  # projector ablations; "frozen" rows get N = steps // 10 in rows()
    "MAPL 4x + PCA init": _codec("mapl", 4, *PCA),
    "MAPL 4x + own SPEL schedule": _codec("mapl", 4, *OWN_SPEL),
    "MAPL 4x + separate clip": _codec("mapl", 4, *SEPARATE_CLIP),
    "MAPL 4x + zero anchors": _codec("mapl", 4, *ZERO_ANCHORS),
    "MAPL 4x + PCA + frozen after N": _codec("mapl", 4, *PCA, "--pipeline.freeze_projector_after", "{freeze}"),
    "MAPL 4x + all changes": _codec("mapl", 4, *ALL_CHANGES),
    # past 4x: what RVQ itself costs (the same rank-8 codes sent as fp32), and the changes at 8x and 16x
    "MAPL 16x (no RVQ)": _codec("mapl", 16),
    "MAPL 8x + all changes": _codec("mapl", 8, *ALL_CHANGES),
    "MAPL 16x + RVQ + all changes": _codec("mapl", 16, *RVQ, *ALL_CHANGES),
    # which part of RVQ helps once the changes are in: the quantizer, or its commitment loss
    "MAPL 16x + all changes (no RVQ)": _codec("mapl", 16, *ALL_CHANGES),
    "MAPL 16x + RVQ + all changes - commitment": _codec("mapl", 16, *RVQ, *ALL_CHANGES,
                                                           "--pipeline.rvq.commitment", "0"),
    # how often the codebook EMA is applied (issue 20, item 6): each update's rows travel, so rarer updates
    # send fewer bytes; "every microbatch" is the behaviour before the update window existed
    "MAPL 16x + RVQ (EMA every microbatch)": _codec("mapl", 16, *RVQ, "--pipeline.rvq.update_every", "0"),
    "MAPL 16x + RVQ (EMA every 2 steps)": _codec("mapl", 16, *RVQ, "--pipeline.rvq.update_every", "2"),
    "MAPL 16x + RVQ (EMA every 4 steps)": _codec("mapl", 16, *RVQ, "--pipeline.rvq.update_every", "4"),
    # the anchors' form (issue 20, item 5): receiver-only anchors (ĥ = Ac + o(t)) need no gradient exchange
    "MAPL 4x + all changes (receiver anchors)": _codec("mapl", 4, *ALL_CHANGES, "--pipeline.anchor_form", "receiver"),
    "MAPL 16x + RVQ + all changes (receiver anchors)": _codec("mapl", 16, *RVQ, *ALL_CHANGES,
                                                                 "--pipeline.anchor_form", "receiver"),
})
# slimpar's MAPL as the CLI runs it today, nothing pinned: K counts every byte a boundary sends (r fitted to it),
# receiver anchors, local ids, PCA start, SPEL's own schedule, a separate clip
DEFAULTS = ["--pipeline.codec", "mapl"]
ROWS.update({
    "MAPL 4x (CLI defaults)": [*DEFAULTS, "--pipeline.compression", "4"],
    "MAPL 16x + RVQ (CLI defaults)": [*DEFAULTS, "--pipeline.compression", "16", *RVQ],
})
# the quick version checks the harness end to end; every codec's byte count is also checked in the unit tests
QUICK = ("none", "MAPL 4x", "MAPL 16x + RVQ")


# On one GPU every row is a virtual pipeline (pipeline/virtual.py): the same stages, codecs and
# messages in one process, bytes counted at the same sends, but no links to time or throttle.
ON_GPU = ["--pipeline.virtual", "true", "--parallel.workers", "1", "--parallel.device", "cuda",
          "--data.ood", "none"]


def rows(quick: bool, steps: int = 100, device: str = "cpu") -> list[Row]:
    pipe = PIPE + ON_GPU if device == "cuda" else PIPE  # later overrides win
    if quick:
        base = [*pipe, "--train.steps", "10", "--eval.batches", "1", "--data.ood", "none",
                "--checkpoint.export", "false", "--checkpoint.final", "false"]
        return [Row(n, "configs/llama_tiny.toml", base + ROWS[n], "llama-tiny") for n in QUICK]
    base = [*pipe, "--train.steps", str(steps)]
    freeze = str(max(steps // 10, 1))
    return [Row(n, "configs/llama_small.toml", base + [a.format(freeze=freeze) for a in o], "llama")
            for n, o in ROWS.items()]


def line(result: dict, none: dict | None) -> dict:
    s = result["summary"]
    out = {"row": result["row"], "group": result["group"], "val_loss": s.get("val_loss"),
           "val_bits_per_byte": s.get("val_bits_per_byte"), "fwd_bytes": s.get("comm_bytes_per_step_fwd"),
           "bwd_bytes": s.get("comm_bytes_per_step_bwd"), "compression_ratio": s.get("compression_ratio"),
           "compression_ratio_fwd": s.get("compression_ratio_fwd"),
           "compression_ratio_bwd": s.get("compression_ratio_bwd"), "breakdown": s.get("comm_breakdown"),
           "max_orth_error": s.get("max_orth_error"), "spel_time_share": s.get("spel_time_share"),
           "step_time_s": s.get("step_time_s"), "command": result["command"]}
    if none and none.get("val_loss") and out["val_loss"] is not None:
        out["val_loss_gap"] = out["val_loss"] / none["val_loss"] - 1
        for k in ("fwd_bytes", "bwd_bytes"):
            out[f"{k}_vs_none"] = out[k] / none[k] if none.get(k) and out[k] is not None else None
    return out


def report_markdown(lines: list[dict], meta: dict) -> str:
    headers = ["row", "val loss", "gap vs none", "fwd bytes/step", "× none", "bwd bytes/step", "× none",
               "ratio fwd / bwd", "max ‖AᵀA−I‖", "SPEL share", "step time (s)", "× none, median [range] over rounds"]
    body = [[ln["row"], fmt(ln["val_loss"], 4), fmt(ln.get("val_loss_gap"), pct=True),
             fmt(ln["fwd_bytes"], 0), fmt(ln.get("fwd_bytes_vs_none"), 3), fmt(ln["bwd_bytes"], 0),
             fmt(ln.get("bwd_bytes_vs_none"), 3),
             f"{fmt(ln['compression_ratio_fwd'], 1)} / {fmt(ln['compression_ratio_bwd'], 1)}",
             fmt(ln["max_orth_error"], 8) if ln["max_orth_error"] is not None else "–",
             fmt(ln["spel_time_share"], pct=False, digits=3), fmt(ln["step_time_s"], 3),
             ratio_cell(ln.get("step_time"))] for ln in lines]
    head = (f"# slimpar bench mapl\n\nMeasured {meta['date']} on {meta['machine']} ({meta['cpus']} CPUs), commit "
            f"`{meta['git_commit']}`, torch {meta['versions']['torch']}. {_layout(meta)}; "
            "every row trains on the same tokens for the same steps (token-matched). Bytes are summed over the 3 "
            "boundaries and counted at the send, per step, everything included (payload, token ids, codebook "
            f"rows, projector/anchor gradient sums and checksums).\n\n{COMPRESSION_NOTE}\n\n")
    cmds = "\n".join(f"- {ln['row']}: `{ln['command']}`" for ln in lines)
    timing = "\n\n" + timing_note(meta["timing"], meta["timing_rounds"]) if meta.get("timing") else ""
    return (head + commits_note(meta) + markdown_table(headers, body) + timing + "\n\nCommands:\n\n" + cmds
            + "\n")


def _layout(meta: dict) -> str:
    if meta.get("device") == "cuda":
        return f"4 pipeline stages as one virtual pipeline on {meta.get('gpu') or 'one GPU'} (rows run concurrently)"
    return "4 pipeline stages on 4 local gloo processes"


def bench_mapl(out: Path, quick: bool, steps: int = 100, only: set[str] | None = None, device: str = "cpu",
               jobs: int = 1, rounds: int = 2, links: bool = True) -> dict:
    """The rows, then ``rounds`` interleaved timing rounds (benchmarks/timing.py; CPU only), then `none` and
    MAPL 4x over throttled links unless ``links`` is False."""
    from benchmarks.network.throttled import run_throttled, throttled_markdown
    from benchmarks.plots import pareto_plot

    todo = select_rows(rows(quick, steps, device), only)
    out.mkdir(parents=True, exist_ok=True)
    results = run_rows(todo, out, jobs)
    rounds = rounds if device == "cpu" else 0  # GPU rows run concurrently: their times are not compared
    timings = timing_rounds(todo, rounds, out)
    ratios = step_time_ratios(results, timings, "none")
    none = next((line(r, None) for r in results if r["row"] == "none"), None)
    lines = [line(r, none) for r in results]
    for ln in lines:
        ln["step_time"] = ratios.get((ln["group"], ln["row"]))
    meta = metadata({"quick": quick, "steps": None if quick else steps, "device": device, "gpu": _gpu(device),
                     "timing_rounds": rounds, "run_commits": run_commits(results + timings)})
    meta["timing"] = {f"{g}/{n}": v for (g, n), v in ratios.items()} if rounds else None
    linked = [r for r in todo if r.name in ("none", "MAPL 4x")] if device == "cpu" and links else []
    base = {r["row"]: r["summary"] for r in results}
    throttled = (run_throttled(linked, [100.0] if quick else [1000.0, 100.0], out, 4, base, prefix="splm")
                 if linked else [])
    data = {"meta": meta, "lines": lines, "throttled": throttled, "runs": results, "timing_runs": timings}
    write_json(out / "results.json", data)
    links = throttled_markdown(throttled, "none") if linked else ""
    (out / "report.md").write_text(report_markdown(lines, meta) + links)
    pareto_plot(lines, out / "pareto_mapl.png")
    return data


def _gpu(device: str) -> str | None:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else None
