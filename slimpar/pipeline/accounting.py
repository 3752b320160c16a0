"""Run-level communication accounting of a pipeline: per-rank counters → the numbers in summary.json.

Each rank counts what it sends (wire.ByteCounter): a boundary's forward bytes on its sender, its
backward bytes on its receiver. ``summarize`` merges the ranks' totals into bytes per training step
for one pipeline (replicas send the same and are averaged out), per boundary, direction and category,
and compares them with the uncompressed pipeline's bytes for the same model and batch, which are
analytic: every boundary sends (tokens per step) · d float32 numbers each way.

A tied embedding and head (kind ``tied``, stage 0 <-> stage P − 1) is not boundary traffic: it is
summed apart as ``tied_bytes_per_step_*``, the rest as ``boundary_bytes_per_step_*`` (activation /
gradient codes and A's sync), and the ratio is given for the boundaries alone
(``compression_ratio_boundary*``, what the codec achieves) and for the total (``compression_ratio*``,
what the pipeline sends). ``comm_bytes_per_step_*`` stay the totals: boundary + tied. ``boundary_fraction_*`` is
the boundaries' bytes over ``none``'s (what ``pipeline.compression_of = total`` holds to 1/K), and
``payload_share_*`` the payload's part of those bytes (the rest: ids, codebooks, A's and anchors' gradient parts).
"""

from __future__ import annotations

from collections import defaultdict

from slimpar.pipeline.wire import CATEGORIES, DIRECTIONS


def none_bytes_per_step(stages: int, tokens_per_step: int, d: int) -> int:
    """Bytes per direction per step of the uncompressed pipeline: (P − 1) boundaries × N tokens × d × 4."""
    return (stages - 1) * tokens_per_step * d * 4


def summarize(per_rank: list[dict], stages: int, replicas: int, tokens_per_step: int, d: int) -> dict:
    """summary.json entries from every rank's ``rank_stats`` (see strategy)."""
    steps = max((r["steps"] for r in per_rank), default=0) or 1
    per_boundary: dict[int, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    boundary, tied = dict.fromkeys(DIRECTIONS, 0.0), dict.fromkeys(DIRECTIONS, 0.0)
    for r in per_rank:
        for b, direction, cat, n in r["rows"]:
            value = n / replicas / steps
            per_boundary[b][direction][cat] = per_boundary[b][direction].get(cat, 0.0) + value
            (tied if cat == "tied" else boundary)[direction] += value
    none = none_bytes_per_step(stages, tokens_per_step, d)
    sums = {k: boundary[k] + tied[k] for k in DIRECTIONS}
    out = {
        "comm_bytes_per_step_fwd": sums["fwd"],
        "comm_bytes_per_step_bwd": sums["bwd"],
        "boundary_bytes_per_step_fwd": boundary["fwd"],
        "boundary_bytes_per_step_bwd": boundary["bwd"],
        "tied_bytes_per_step_fwd": tied["fwd"],
        "tied_bytes_per_step_bwd": tied["bwd"],
        "comm_bytes_per_step_none": none,
        **_ratios("", sums, none),
        **_ratios("_boundary", boundary, none),
        "bytes_fraction_fwd": sums["fwd"] / none,
        "bytes_fraction_bwd": sums["bwd"] / none,
        **{f"boundary_fraction_{k}": boundary[k] / none for k in DIRECTIONS},
        **{f"payload_share_{k}": _payload(per_boundary, k) / max(boundary[k], 1e-12) for k in DIRECTIONS},
        "comm_breakdown": {f"b{b}": {d_: {c: v[d_].get(c, 0.0) for c in CATEGORIES} for d_ in DIRECTIONS}
                           for b, v in sorted(per_boundary.items())},
        "max_orth_error": max((r["max_orth"] for r in per_rank), default=0.0),
        "spel_time_share": max((r["spel_s"] / r["step_s"] for r in per_rank if r["step_s"] > 0), default=0.0),
        "shared_param_resyncs": sum(r["resyncs"] for r in per_rank),
        "codebook_messages": _merge_counts(r.get("codebook_messages", {}) for r in per_rank),
        "pipeline_train_steps_counted": steps,
    }
    return out


def _payload(per_boundary: dict, direction: str) -> float:
    """Payload bytes per step in ``direction``, summed over the boundaries."""
    return sum(v[direction].get("payload", 0.0) for v in per_boundary.values())


def _ratios(suffix: str, sums: dict[str, float], none: float) -> dict[str, float]:
    """``compression_ratio{suffix}`` (fwd + bwd) and its ``_fwd`` / ``_bwd``: uncompressed / sent."""
    return {f"compression_ratio{suffix}": 2 * none / max(sums["fwd"] + sums["bwd"], 1e-12),
            f"compression_ratio{suffix}_fwd": none / max(sums["fwd"], 1e-12),
            f"compression_ratio{suffix}_bwd": none / max(sums["bwd"], 1e-12)}


def _merge_counts(items) -> dict[str, int]:
    total: dict[str, int] = defaultdict(int)
    for item in items:
        for k, v in item.items():
            total[k] += v
    return dict(total)


def summary_rows(summary: dict) -> list[tuple[str, str]]:
    """Rows for the closing table of ``slimpar train``."""
    from slimpar.utils import fmt_bytes

    tied = summary.get("tied_bytes_per_step_fwd", 0) + summary.get("tied_bytes_per_step_bwd", 0)
    rows = [("pipeline bytes / step fwd (all boundaries)", fmt_bytes(summary.get("boundary_bytes_per_step_fwd"))),
            ("pipeline bytes / step bwd (all boundaries)", fmt_bytes(summary.get("boundary_bytes_per_step_bwd"))),
            ("  uncompressed, each direction", fmt_bytes(summary.get("comm_bytes_per_step_none")))]
    if tied:  # a tied embedding / head: its exchange is not boundary traffic and is shown apart
        rows += [("tied weight exchange / step, stage 0 → last", fmt_bytes(summary.get("tied_bytes_per_step_fwd"))),
                 ("tied weight exchange / step, last → stage 0", fmt_bytes(summary.get("tied_bytes_per_step_bwd"))),
                 ("compression ratio, boundaries (fwd + bwd)",
                  f"{summary.get('compression_ratio_boundary', 0):.2f}x"),
                 ("compression ratio, total with tied exchange", f"{summary.get('compression_ratio', 0):.2f}x")]
    else:
        rows.append(("compression ratio (fwd + bwd)", f"{summary.get('compression_ratio', 0):.2f}x"))
    if "pipeline_rank" in summary:  # r as the run resolved it; the payload's part of the boundaries' bytes
        rows.append(("rank r; payload share of boundary bytes (fwd / bwd)",
                     f"{summary['pipeline_rank']}; {summary.get('payload_share_fwd', 0):.1%} / "
                     f"{summary.get('payload_share_bwd', 0):.1%}"))
    rows += [("max |AᵀA − I|", f"{summary.get('max_orth_error', 0):.1e}"),
             ("SPEL share of step time", f"{100 * summary.get('spel_time_share', 0):.1f}%")]
    return rows
