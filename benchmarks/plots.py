"""PNG plots for benchmark reports (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

KINDS = ("params", "grads", "optimizer", "activations")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def sdp_plots(lines: list[dict], results: list[dict], out: Path) -> None:
    """Memory breakdown bars, loss curves and validation loss against peak memory, per group."""
    plt = _plt()
    for group in sorted({ln["group"] for ln in lines}):
        mine = [ln for ln in lines if ln["group"] == group]
        fig, ax = plt.subplots(figsize=(max(6, len(mine) * 0.8), 4))
        bottom = [0.0] * len(mine)
        for kind in KINDS:
            vals = [(ln["mem_breakdown"] or {}).get(kind, 0) / 2**20 for ln in mine]
            ax.bar(range(len(mine)), vals, bottom=bottom, label=kind)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        peaks = [(ln["peak_mem_bytes"] or 0) / 2**20 for ln in mine]
        ax.scatter(range(len(mine)), peaks, color="black", marker="_", s=300, label="peak live", zorder=3)
        ax.set_xticks(range(len(mine)), [ln["row"] for ln in mine], rotation=45, ha="right")
        ax.set_ylabel("MiB per worker")
        ax.set_title(f"memory per worker ({group})")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"memory_{group}.png", dpi=120)
        plt.close(fig)
        _curves(plt, [r for r in results if r["group"] == group and r["seed"] == min(ln["seeds"][0] for ln in mine)],
                out / f"loss_curves_{group}.png", group)
        _scatter(plt, mine, out / f"loss_vs_memory_{group}.png", group)


def _curves(plt, runs: list[dict], path: Path, group: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in runs:
        ax.plot([c["step"] for c in r["curve"]], [c["loss"] for c in r["curve"]], label=r["row"], lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"loss curves ({group})")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _scatter(plt, lines: list[dict], path: Path, group: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for ln in lines:
        if ln["val_loss"] is None or ln["peak_mem_bytes"] is None:
            continue
        ax.scatter(ln["peak_mem_bytes"] / 2**20, ln["val_loss"])
        ax.annotate(ln["row"], (ln["peak_mem_bytes"] / 2**20, ln["val_loss"]), fontsize=6)
    ax.set_xlabel("peak memory per worker (MiB)")
    ax.set_ylabel("validation loss")
    ax.set_title(f"validation loss vs memory ({group})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pareto_plot(lines: list[dict], path: Path) -> None:
    """Validation loss against bytes per step (forward + backward), one point per codec row."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for ln in lines:
        total = (ln.get("fwd_bytes") or 0) + (ln.get("bwd_bytes") or 0)
        if ln.get("val_loss") is None or not total:
            continue
        ax.scatter(total / 2**20, ln["val_loss"])
        ax.annotate(ln["row"], (total / 2**20, ln["val_loss"]), fontsize=6)
    ax.set_xscale("log")
    ax.set_xlabel("bytes per step, forward + backward (MiB, log scale)")
    ax.set_ylabel("validation loss")
    ax.set_title("compressed pipelines: loss vs bytes")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def modes_plot(table: list[dict], path: Path) -> None:
    """Per mode: compiled / eager step time (median, whiskers to the rounds' range) and bf16 / fp32 peak memory."""
    plt = _plt()
    names = [ln["mode"] for ln in table]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.35 * len(names) + 1.5), sharey=True)
    ys = range(len(names))
    ratio = [(ln["compiled_vs_eager"] or {}) for ln in table]
    med = [r.get("ratio_median") or 0 for r in ratio]
    lo = [m - (r.get("ratio_min") or m) for m, r in zip(med, ratio, strict=True)]
    hi = [(r.get("ratio_max") or m) - m for m, r in zip(med, ratio, strict=True)]
    left.barh(ys, med, xerr=[lo, hi], color="tab:blue")
    left.axvline(1.0, color="black", lw=0.8)
    left.set_xlabel("compiled / eager step time (inductor, CPU)")
    mem = [(ln["bf16_peak_mem_bytes"] or 0) / (ln["eager_peak_mem_bytes"] or 1) for ln in table]
    right.barh(ys, mem, color="tab:orange")
    right.axvline(1.0, color="black", lw=0.8)
    right.set_xlabel("bf16 / fp32 peak memory per worker")
    left.set_yticks(list(ys), names, fontsize=8)
    left.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
