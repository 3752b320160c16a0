"""``slimpar plan --fit``'s output: the ranked table (Markdown) and its JSON."""

from __future__ import annotations

import shlex

from slimpar.plan.cluster import Cluster
from slimpar.plan.fit import FitConfig, Scored

HEAD = ("rank", "configuration", "fits", "peak GiB / worker", "bytes / step (intra, inter)", "step s", "tokens/s",
        "predicted loss gap ±", "the `slimpar train` command")


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB" if n >= 1e8 else f"{n / 1e6:.3g} MB"


def command(r: Scored, base_args: list[str]) -> str:
    return "slimpar train " + shlex.join([*base_args, *r.candidate.overrides])


def row(i: int, r: Scored, base_args: list[str]) -> list[str]:
    if r.config is None:
        return [str(i), r.candidate.name, "no", "–", "–", "–", "–", "–", r.why]
    peak = "–" if r.peak is None else f"{r.peak / 1024**3:.1f}"
    fits = "yes" if r.fits else f"no: {r.why}"
    return [str(i), r.candidate.name, fits, peak, f"{_gb(r.bytes_intra)}, {_gb(r.bytes_inter)}", f"{r.step_s:.3g}",
            f"{r.tokens_per_s:,.0f}", r.gap.text() if r.gap else "–", f"`{command(r, base_args)}`"]


def markdown(rows: list[Scored], cluster: Cluster, fc: FitConfig, base_args: list[str], header: str) -> str:
    lines = [header, "", "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(row(i + 1, r, base_args)) + " |" for i, r in enumerate(rows)]
    lines += ["", *[f"- {n}" for n in cluster.notes]]
    return "\n".join(lines)


def as_json(rows: list[Scored], cluster: Cluster, fc: FitConfig, base_args: list[str], extra: dict) -> dict:
    out = []
    for i, r in enumerate(rows):
        d = r.as_dict()
        d["rank"] = i + 1
        d["command"] = command(r, base_args)
        out.append(d)
    return {"cluster": cluster.as_dict(), "fit": vars(fc), **extra, "candidates": out}
