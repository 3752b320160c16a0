"""The loss gap each candidate pays against DDP, from the committed quality studies (docs/results/quality and
docs/results/tuned), at the run's tokens per parameter.

``evidence.json`` (shipped in the package) holds, per method, the measured points: tokens per parameter of the
study's run, the relative validation-loss gap to its baseline (DDP for SDP, the uncompressed pipeline for the
codecs) in and out of domain, each with its spread over seeds, and the row and commit it came from. Write it
anew from a checkout with ``python -m slimpar.plan.evidence``; the suite checks that it equals what the
results files give.

It also holds, per GPU, the best MFU a ``slimpar train`` row reached in a committed ``bench throughput`` run on
that GPU (none is committed yet), which the cluster presets start from.

A gap is read off by linear interpolation in log(tokens per parameter) between the points that surround the
run's; outside the measured range there is no evidence, and the answer says which range was measured. DDP,
FSDP2 and the uncompressed pipeline train the same update as DDP: their gap is 0 by construction.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

EVIDENCE_FILE = Path(__file__).with_name("evidence.json")
EXACT = ("exact", "pipeline none")

# method key -> (results file under docs/results, group, row; "{steps}" matches a length row's suffix)
SOURCES: dict[str, list[tuple[str, str, str]]] = {
    "sdp forward 0.5": [("tuned", "length", "B-SDP 0.5 at {steps} steps")],
    "sdp backward 0.5": [("tuned", "length", "Bb-SDP 0.5 at {steps} steps")],
    "sdp backward 0.375": [("tuned", "length", "Bb-SDP 3/8 at {steps} steps")],
    "sdp forward 0.375": [("quality", "sdp", "B-SDP 3/8")],
    "pipeline MAPL 4x": [("tuned", "length", "MAPL 4x at {steps} steps")],
    "pipeline MAPL 8x": [("quality", "mapl", "MAPL 8x + all changes")],
    "pipeline MAPL 16x": [("quality", "mapl", "MAPL 16x + all changes (no RVQ)")],
    "pipeline MAPL 16x + RVQ": [("quality", "mapl", "MAPL 16x + RVQ + all changes")],
}


@dataclass(frozen=True)
class Gap:
    """A predicted relative loss gap (0.02 = 2% higher validation loss), or None with why."""

    gap: float | None
    std: float | None
    ood_gap: float | None
    note: str

    def text(self) -> str:
        if self.gap is None:
            return self.note
        if self.std is None:
            return f"{100 * self.gap:+.1f}%"
        return f"{100 * self.gap:+.1f}% ± {100 * self.std:.1f}"


def _tokens_per_param(command: str) -> float:
    """Tokens trained per parameter of the run a results line's command describes."""
    from slimpar.config import load_config
    from slimpar.plan.shape import shape_of

    args = shlex.split(command)[2:]  # after "slimpar train"
    config = args[args.index("--config") + 1]
    rest = [a for i, a in enumerate(args) if a != "--config" and (i == 0 or args[i - 1] != "--config")]
    cfg = load_config(config.removeprefix("configs/").removesuffix(".toml"), rest)
    return cfg.train.steps * cfg.train.batch_size * cfg.data.seq_len / shape_of(cfg).params


def build_evidence(results: Path) -> dict:
    """The evidence table from the results files under ``results`` (docs/results)."""
    out: dict = {}
    files = {name: json.loads((results / name / "results.json").read_text()) for name in ("quality", "tuned")}
    for key, sources in SOURCES.items():
        points = []
        for name, group, row in sources:
            pattern = re.compile(re.escape(row).replace(re.escape("{steps}"), r"\d+") + "$")
            for line in files[name]["lines"]:
                if line["group"] == group and pattern.match(line["row"]):
                    points.append({"tokens_per_param": _tokens_per_param(line["command"]),
                                   "gap": line["val_loss_gap"], "gap_std": line["val_loss_gap_std"],
                                   "ood_gap": line.get("val_wikipedia_loss_gap"), "seeds": len(line["seeds"]),
                                   "row": f"{name}: {line['row']}", "commit": files[name]["meta"]["git_commit"]})
        out[key] = sorted(points, key=lambda p: p["tokens_per_param"])
    out["mfu"] = build_mfu(results)
    return out


def build_mfu(results: Path) -> dict:
    """GPU name -> the best MFU of a ``slimpar train`` row in the committed ``bench throughput`` results on a GPU
    (docs/results/throughput*/results.json), with its row, model size and commit."""
    out: dict = {}
    for path in sorted(results.glob("throughput*/results.json")):
        data = json.loads(path.read_text())
        meta = data["meta"]
        if meta.get("device") != "cuda":
            continue
        rows = [ln for ln in data["lines"] if ln["row"].startswith("train") and ln.get("mfu")]
        if rows:
            best = max(rows, key=lambda ln: ln["mfu"])
            out[meta["device_name"]] = {"mfu": best["mfu"], "row": best["row"], "size": meta["shape"]["size"],
                                        "commit": meta["git_commit"], "file": path.relative_to(results).as_posix()}
    return out


def measured_mfu(gpu: str, evidence: dict | None = None) -> dict | None:
    """The committed MFU record of the first GPU whose name contains ``gpu`` (e.g. "H100"), or None."""
    table = (evidence if evidence is not None else load_evidence()).get("mfu", {})
    return next((v for name, v in table.items() if gpu.lower() in name.lower()), None)


def load_evidence() -> dict:
    return json.loads(EVIDENCE_FILE.read_text())


def predict_gap(key: str, tokens_per_param: float, evidence: dict | None = None) -> Gap:
    """The gap of method ``key`` at ``tokens_per_param`` (module docstring)."""
    if key in EXACT:
        return Gap(0.0, None, 0.0, "exact: the same update as DDP")
    points = (evidence if evidence is not None else load_evidence()).get(key, [])
    if not points:
        return Gap(None, None, None, "no evidence")
    lo, hi = points[0]["tokens_per_param"], points[-1]["tokens_per_param"]
    if not lo * 0.999 <= tokens_per_param <= hi * 1.001:
        near = points[0] if tokens_per_param < lo else points[-1]
        span = f"{lo:.2g}" if len(points) == 1 else f"{lo:.2g}-{hi:.2g}"
        return Gap(None, None, None, f"no evidence at {tokens_per_param:.2g} tokens/param (measured at {span}; "
                                     f"{100 * near['gap']:+.1f}% at {near['tokens_per_param']:.2g})")
    if len(points) == 1:
        p = points[0]
        return Gap(p["gap"], p["gap_std"], p["ood_gap"], p["row"])
    for a, b in zip(points, points[1:], strict=False):
        if tokens_per_param <= b["tokens_per_param"] * 1.001:
            u = (math.log(tokens_per_param) - math.log(a["tokens_per_param"])) / \
                (math.log(b["tokens_per_param"]) - math.log(a["tokens_per_param"]))
            u = min(max(u, 0.0), 1.0)
            mix = {k: (1 - u) * a[k] + u * b[k] for k in ("gap", "gap_std", "ood_gap")}
            return Gap(mix["gap"], mix["gap_std"], mix["ood_gap"], f"between {a['row']} and {b['row']}")
    raise AssertionError("unreachable: the range check above holds")


def main() -> None:
    """Write evidence.json from the checkout's docs/results."""
    root = Path(__file__).resolve().parents[2] / "docs" / "results"
    EVIDENCE_FILE.write_text(json.dumps(build_evidence(root), indent=1) + "\n")
    print(f"wrote {EVIDENCE_FILE}")


if __name__ == "__main__":
    main()
