"""``slimpar bench wallclock``: step time where the network dominates, on two real "nodes" of this machine.

Two network namespaces with 2 workers each (:class:`~benchmarks.network.nodes.TwoNodes`, one torchrun per node):
the inter-node veth pair is limited with ``tbf`` in both directions, the intra-node traffic uses each
node's loopback at full speed. Rows: DDP, FSDP2 and B-SDP 0.5 + FSDP2 (``--sdp.fsdp 2``: each of the 2 SDP
replicas sharded over the 2 ranks of one node) and the 4-stage pipeline with codecs none, int8, MAPL 4x,
MAPL 8x and MAPL 16x + RVQ, at 1000, 100, 10 and 1 Mbit/s. Every run is a short timing run; its step time
is the run's median after warm-up. The inter-node bytes per step are read from the veth counters while the
run goes, between the warm-up's end and the last step (the busier direction; headers included).

Per row the model ``step time = compute + bytes * 8 / bandwidth`` is fitted by least squares over the
bandwidths with ``bytes`` fixed to the measured inter-node bytes (``compute`` is the one free parameter);
a free two-parameter fit (``bytes_eff``) shows how far the link is from fully used. Crossovers: the
bandwidth below which a row's fitted step time beats the reference row's (DDP, resp. codec none).
Latency is not applied (no netem here): ``LATENCY_NOTE``.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

from benchmarks.mapl import PIPE, RVQ, _codec
from benchmarks.network.links import LATENCY_NOTE, _kill
from benchmarks.network.nodes import TwoNodes, run_two_nodes
from benchmarks.report import fmt, markdown_table, metadata, write_json
from benchmarks.runner import CONFIGS

RATES = (1000.0, 100.0, 10.0, 1.0)
STEPS = {1000.0: 8, 100.0: 8, 10.0: 6, 1.0: 4}  # the slow rates are capped; the median skips 2 warm-up steps
WARMUP = 2
TIMING = ["--eval.batches", "1", "--data.ood", "none", "--checkpoint.export", "false", "--checkpoint.final", "false",
          "--log.progress", "false", "--log.every", "1"]
SDP_ROWS = {
    "DDP": ["--parallel.mode", "ddp"],
    "FSDP2": ["--parallel.mode", "fsdp"],
    "B-SDP 0.5 + FSDP2": ["--parallel.mode", "sdp", "--sdp.level", "block", "--sdp.keep", "0.5", "--sdp.fsdp", "2"],
}
MAPL_ROWS = {"none": _codec("none"), "int8": _codec("int8"), "MAPL 4x": _codec("mapl", 4),
             "MAPL 8x": _codec("mapl", 8), "MAPL 16x + RVQ": _codec("mapl", 16, *RVQ)}
REFERENCE = {"sdp": "DDP", "mapl": "none"}
QUICK = {"rows": ("DDP", "B-SDP 0.5 + FSDP2", "none", "MAPL 4x"), "rates": (100.0, 10.0)}


def rows(quick: bool) -> list[tuple[str, str, list[str]]]:
    """(family, name, overrides) for every row in the sweep."""
    out = [("sdp", n, ["--parallel.workers", "4", *o]) for n, o in SDP_ROWS.items()]
    out += [("mapl", n, [*PIPE, *o]) for n, o in MAPL_ROWS.items()]
    return [r for r in out if not quick or r[1] in QUICK["rows"]]


# ------------------------------------------------------------------------------------- measuring
class _Sampler:
    """Polls the inter-node veth counters (``/proc/PID/net/dev`` of a ``sleep`` in each namespace: no process
    per sample) and the number of lines in ``metrics.jsonl`` (one per finished step) every ``period`` s."""

    def __init__(self, nodes: TwoNodes, metrics: Path, period: float = 0.05) -> None:
        self.nodes, self.metrics, self.period = nodes, metrics, period
        self.samples: list[tuple[float, int, int, int]] = []
        self._stop = threading.Event()
        self._procs: list[subprocess.Popen] = []
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _Sampler:
        self._procs = [subprocess.Popen([*self.nodes.exec_prefix(k), "sleep", "86400"], start_new_session=True)
                       for k in (0, 1)]
        time.sleep(0.2)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        _kill(self._procs)

    def _tx(self, k: int) -> int:
        for line in Path(f"/proc/{self._procs[k].pid}/net/dev").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name.strip() == self.nodes.ifname(k):
                return int(rest.split()[8])
        raise RuntimeError(f"no counters for {self.nodes.ifname(k)}")

    def _loop(self) -> None:
        while not self._stop.is_set():
            lines = self.metrics.read_text().count("\n") if self.metrics.exists() else 0
            self.samples.append((time.perf_counter(), lines, self._tx(0), self._tx(1)))
            time.sleep(self.period)

    def per_step(self, first: int, last: int) -> dict:
        """Bytes each node sent per step and wall seconds per step between steps ``first`` and ``last``."""
        a = next(s for s in self.samples if s[1] >= first)
        b = next(s for s in self.samples if s[1] >= last)
        n = last - first
        return {"tx_bytes_per_step": [(b[2] - a[2]) / n, (b[3] - a[3]) / n], "wall_per_step_s": (b[0] - a[0]) / n}


def run_one(family: str, name: str, overrides: list[str], rate: float, steps: int, root: Path) -> dict:
    """One timing run over the two nodes at ``rate`` (reused when its line.json exists)."""
    run_dir = root / "runs" / f"{family}-{name}-{rate:g}mbit".replace(" ", "_").replace("+", "p").replace(".", "_")
    done = run_dir / "line.json"
    if done.exists():
        return json.loads(done.read_text())
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    args = [*overrides, "--train.steps", str(steps), *TIMING]
    with TwoNodes(rate_mbit=rate, prefix="spnwc") as nodes, _Sampler(nodes, run_dir / "metrics.jsonl") as sampler:
        summary = run_two_nodes(nodes, CONFIGS / "llama_tiny.toml", run_dir, args, timeout_s=600 + 60 * steps)
        time.sleep(2 * sampler.period)
    measured = sampler.per_step(WARMUP, steps)
    line = {"family": family, "row": name, "rate_mbit": rate, "steps": steps,
            "step_time_s": summary.get("step_time_s"), "val_loss": summary.get("val_loss"),
            "bytes_per_step": max(measured["tx_bytes_per_step"]), **measured,
            "run_wall_s": summary["links"]["wall_s"], "commands": summary["links"]["commands"]}
    done.write_text(json.dumps(line, indent=1))
    return line


# ----------------------------------------------------------------------------------------- model
def fit_row(points: list[tuple[float, float, float]]) -> dict:
    """Fit ``t = c + 8 B / (r 1e6)`` to (rate Mbit/s, step time s, bytes per step) points.

    ``compute_s``: least squares of the relative residuals with B fixed to the measured bytes (their median
    over the rates);
    ``compute_free_s`` and ``bytes_eff``: the two-parameter least-squares line in x = 8 / (r 1e6)."""
    import numpy as np

    rate = np.array([p[0] for p in points])
    t = np.array([p[1] for p in points])
    x = 8 / (rate * 1e6)
    b = float(np.median([p[2] for p in points]))
    w = 1 / t**2  # relative residuals: the rates span 1000x, so absolute ones would fit the slowest point only
    c = float(np.sum(w * (t - b * x)) / np.sum(w))
    out = {"bytes": b, "compute_s": c, "rms_rel": float(np.sqrt(np.mean(((c + b * x) / t - 1) ** 2)))}
    if len(points) >= 2:
        (c2, b2), *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], 1) / t[:, None], t / t, rcond=None)
        out.update(compute_free_s=float(c2), bytes_eff=float(b2))
    return out


def predict(fit: dict, rate_mbit: float) -> float:
    return fit["compute_s"] + fit["bytes"] * 8 / (rate_mbit * 1e6)


def crossover(fit: dict, ref: dict) -> dict:
    """Where ``fit`` starts to beat ``ref``: ``below``/``above`` a bandwidth (Mbit/s), ``always`` or ``never``."""
    dc, db = fit["compute_s"] - ref["compute_s"], ref["bytes"] - fit["bytes"]  # extra compute, bytes saved
    if dc <= 0 and db >= 0:
        return {"pays": "always", "mbit": None}
    if dc >= 0 and db <= 0:
        return {"pays": "never", "mbit": None}
    return {"pays": "below" if db > 0 else "above", "mbit": 8 * db / dc / 1e6}


# 1B-parameter LLaMA-like model, two datacenters joined by one link (the papers' cross-datacenter setting)
PAPER = {"params": 1.2e9, "d_model": 2048, "tokens_per_step": 256 * 2048, "rate_mbit": 1000.0,
         "gpus": 16, "flops_per_gpu": 4e14, "grad_bytes": 4, "act_bytes": 4}


def paper_predictions(fits: dict[str, dict]) -> list[dict]:
    """Step time at ``PAPER``'s setting: compute = 6 P tokens / (gpus * flops); DDP's inter-DC bytes per
    direction = P * grad_bytes (a 2-node all-reduce sends half in reduce-scatter, half in all-gather); the
    uncompressed pipeline's busier direction = tokens * d_model * act_bytes (one boundary crosses). Other rows
    scale their reference's bytes by the ratio measured here (the codecs' and SDP's savings are per element)."""
    p = PAPER
    compute = 6 * p["params"] * p["tokens_per_step"] / (p["gpus"] * p["flops_per_gpu"])
    base = {"sdp": p["params"] * p["grad_bytes"], "mapl": p["tokens_per_step"] * p["d_model"] * p["act_bytes"]}
    out = []
    for name, f in fits.items():
        ref = fits.get(REFERENCE[f["family"]])
        if not ref or not ref["bytes"]:
            continue
        b = base[f["family"]] * f["bytes"] / ref["bytes"]
        out.append({"row": name, "family": f["family"], "bytes": b, "compute_s": compute,
                    "step_time_s": compute + b * 8 / (p["rate_mbit"] * 1e6)})
    for ln in out:
        ref_t = next(o["step_time_s"] for o in out if o["row"] == REFERENCE[ln["family"]])
        ln["vs_reference"] = ln["step_time_s"] / ref_t
    return out


# ---------------------------------------------------------------------------------------- report
def report_markdown(lines: list[dict], fits: dict[str, dict], paper: list[dict], meta: dict) -> str:
    head = (f"# slimpar bench wallclock\n\nMeasured {meta['date']} on {meta['machine']} ({meta['cpus']} CPUs), "
            f"commit `{meta['git_commit']}`, torch {meta['versions']['torch']}. Two network namespaces (\"nodes\") "
            "with 2 gloo workers each, one `torchrun --nnodes 2 --nproc_per_node 2` per node; the inter-node veth "
            "pair is limited with `tbf` in both directions, intra-node traffic uses loopback unthrottled. "
            f"configs/llama_tiny.toml, steps per rate {meta['steps']}; step time = median after {WARMUP} warm-up "
            "steps. Bytes = inter-node bytes per step in the busier direction, from the veth counters (headers "
            f"included). {LATENCY_NOTE} Load average at the end: {meta.get('loadavg_1m_at_end', 0):.1f} (the "
            "machine's cores are shared, so compute times are noisy; the byte counts are not). tbf's bucket holds at "
            "least 64 KiB (`links.TbfParams`), which leave at line rate after the link has idled: rows that send "
            "little more than that per step run faster than the model at 10-100 Mbit/s.\n\n")
    rates = sorted({ln["rate_mbit"] for ln in lines}, reverse=True)
    by = {(ln["row"], ln["rate_mbit"]): ln for ln in lines}
    headers = ["row", "inter-node bytes/step", *[f"{r:g} Mbit/s: measured / fitted (s)" for r in rates],
               "compute (s)", "free fit: bytes_eff / bytes", "crossover vs reference"]
    body = []
    for name, f in fits.items():
        cells = []
        for r in rates:
            ln = by.get((name, r))
            cells.append(f"{fmt(ln['step_time_s'], 3)} / {fmt(predict(f, r), 3)}" if ln else "–")
        x = f["crossover"]
        cross = (f"pays {x['pays']} {x['mbit']:.3g} Mbit/s" if x["mbit"] is not None else f"pays {x['pays']}")
        body.append([name, fmt(f["bytes"], 0), *cells, fmt(f["compute_s"], 3),
                     fmt(f["bytes_eff"] / f["bytes"], 2) if f.get("bytes_eff") and f["bytes"] else "–",
                     "reference" if name == REFERENCE[f["family"]] else cross])
    pp = PAPER
    ptab = markdown_table(["row", "inter-DC bytes/step", "step time (s)", "× reference"],
                          [[p["row"], f"{p['bytes'] / 1e9:.3g} GB", fmt(p["step_time_s"], 2),
                            fmt(p["vs_reference"], 3)] for p in paper])
    assume = (f"\n\n## What the model predicts for the papers' setting\n\nAssumptions: a {pp['params'] / 1e9:g}B "
              f"LLaMA-like model (d_model {pp['d_model']}), two datacenters joined by {pp['rate_mbit']:g} Mbit/s "
              f"(no latency), intra-datacenter links free; {pp['tokens_per_step']} tokens per step; compute = "
              f"6·P·tokens on {pp['gpus']} GPUs at {pp['flops_per_gpu'] / 1e12:g} TFLOP/s effective = "
              f"{paper[0]['compute_s'] if paper else 0:.2f} s, not overlapped with communication. DDP: fp32 "
              "gradients, a 2-node all-reduce sends P·4 bytes each way; pipeline: the one inter-DC boundary carries "
              "tokens·d·4 bytes each way (forward activations, backward gradients). Other rows: their reference's "
              "bytes times the ratio measured above on the tiny model (fixed per-step overheads such as codebook "
              "rows and projector-gradient sums are relatively larger there, so the codecs' savings are if anything "
              "understated).\n\n")
    return head + markdown_table(headers, body) + assume + ptab + "\n"


def plot(lines: list[dict], fits: dict[str, dict], path: Path) -> None:
    import numpy as np

    from benchmarks.plots import _plt

    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    grid = np.logspace(-0.3, 3.3, 60)
    for ax, family in zip(axes, ("sdp", "mapl"), strict=True):
        for i, (name, f) in enumerate((n, f) for n, f in fits.items() if f["family"] == family):
            color = f"C{i}"
            pts = [ln for ln in lines if ln["row"] == name]
            ax.scatter([p["rate_mbit"] for p in pts], [p["step_time_s"] for p in pts], color=color, zorder=3)
            ax.plot(grid, [predict(f, r) for r in grid], color=color, lw=1, label=name)
            x = f["crossover"]
            if x["mbit"] is not None and grid[0] <= x["mbit"] <= grid[-1]:
                ax.axvline(x["mbit"], color=color, ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("inter-node bandwidth (Mbit/s, tbf both ways)")
        ax.set_ylabel("step time (s)")
        ax.set_title(f"{family}: measured (dots) vs compute + bytes/bandwidth (lines)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bench_wallclock(out: Path, quick: bool = False, only: set[str] | None = None,
                    rates: tuple[float, ...] | None = None) -> dict:
    """The sweep (finished runs in ``out/runs`` are reused); ``rates`` (Mbit/s, keys of ``STEPS``) overrides
    the rates of ``quick`` or the full sweep."""
    every = rows(quick)
    todo = [r for r in every if not only or r[1] in only]
    if unknown := (only or set()) - {r[1] for r in every}:
        from slimpar.config import ConfigError  # imports torch: only on this error path

        raise ConfigError(f"unknown wallclock rows {sorted(unknown)}; known: {[r[1] for r in every]}")
    out.mkdir(parents=True, exist_ok=True)
    rates = rates or (QUICK["rates"] if quick else RATES)
    lines = [run_one(fam, name, ov, rate, STEPS[rate], out) for rate in rates for fam, name, ov in todo]
    fits: dict[str, dict] = {}
    for fam, name, _ in todo:
        pts = [(ln["rate_mbit"], ln["step_time_s"], ln["bytes_per_step"]) for ln in lines if ln["row"] == name]
        fits[name] = {"family": fam, **fit_row(pts)}
    for f in fits.values():
        ref = fits.get(REFERENCE[f["family"]])
        f["crossover"] = crossover(f, ref) if ref else {"pays": "no reference row", "mbit": None}
    paper = paper_predictions(fits)
    meta = metadata({"quick": quick, "rates_mbit": list(rates), "steps": {f"{r:g}": STEPS[r] for r in rates},
                     "latency_applied": False, "loadavg_1m_at_end": __import__("os").getloadavg()[0]})
    data = {"meta": meta, "lines": lines, "fits": fits, "paper": {"assumptions": PAPER, "rows": paper}}
    write_json(out / "results.json", data)
    (out / "report.md").write_text(report_markdown(lines, fits, paper, meta))
    plot(lines, fits, out / "wallclock.png")
    return data
