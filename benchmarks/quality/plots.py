"""``slimpar bench quality``'s plots: loss curves, the gap at every evaluation, and the final gaps."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.quality import trends as quality_trends
from benchmarks.quality.report import BASELINE, TREND_GROUPS


def _points(run: dict, key: str) -> dict[int, float]:
    """step -> value of ``key`` over the run; validation keys end with the final evaluation from the summary."""
    points = {c["step"]: c[key] for c in run["curve"] if c.get(key) is not None}
    final, steps = run["summary"].get(key), run["summary"].get("steps")
    if key.startswith("val_") and final is not None and steps:
        points[steps] = final
    return points


def _mean_curve(runs: list[dict], key: str) -> tuple[list[int], list[float]]:
    """The curve of ``key`` averaged over seeds at the steps every seed logged."""
    per_seed = [_points(r, key) for r in runs]
    steps = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    return steps, [statistics.fmean(s[k] for s in per_seed) for k in steps]


def _style(plt, i: int) -> dict:
    """Row i's colour and line style: 20 distinct colours, then the same colours dashed (a group has up to ~25 rows)."""
    return {"color": plt.get_cmap("tab20")(i % 20), "linestyle": ("-", "--", ":")[i // 20 % 3]}


def plots(results: list[dict], lines: list[dict], out: Path) -> None:
    """Per LLaMA group: training and validation loss against step (mean over seeds), and the gaps with error bars."""
    from benchmarks.plots import _plt

    plt = _plt()
    for group in dict.fromkeys(ln["group"] for ln in lines):
        runs = [r for r in results if r["group"] == group]
        names = list(dict.fromkeys(r["row"] for r in runs))
        if group in TREND_GROUPS:  # dozens of (row, length) lines: the gap against tokens or parameters instead,
            quality_trends.plot(results, group, out)  # and each point's gap during its training
            _gap_curves(plt, runs, names, group, "val_loss", out / f"gap_vs_step_{group}.png",
                        quality_trends.baseline_name)
            continue
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        key = "val_accuracy" if group == "resnet" else "val_loss"
        for i, name in enumerate(names):
            mine = [r for r in runs if r["row"] == name]
            axes[0].plot(*_mean_curve(mine, "loss"), label=name, lw=0.8, **_style(plt, i))
            axes[1].plot(*_mean_curve(mine, key), label=name, lw=1, marker=".", **_style(plt, i))
        axes[0].set(xlabel="step", ylabel="training loss (mean over seeds)", title=f"{group}: training loss")
        axes[1].set(xlabel="step", ylabel=f"{key} (mean over seeds)", title=f"{group}: validation")
        if group != "resnet":
            axes[0].set_ylim(top=min(6.0, axes[0].get_ylim()[1]))
        axes[1].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / f"curves_{group}.png", dpi=120)
        plt.close(fig)
        _gap_curves(plt, runs, names, group, key, out / f"gap_vs_step_{group}.png")
        mine = [ln for ln in lines if ln["group"] == group and ln.get(f"{key}_gap") is not None]
        if mine:
            fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(mine)), 4))
            ax.bar(range(len(mine)), [100 * ln[f"{key}_gap"] for ln in mine],
                   yerr=[100 * (ln[f"{key}_gap_std"] or 0) for ln in mine], capsize=3)
            ax.set_xticks(range(len(mine)), [ln["row"] for ln in mine], rotation=45, ha="right", fontsize=7)
            ax.set_ylabel(f"{key} gap vs {BASELINE.get(group)} (%), ± std over seeds")
            ax.axhline(0, color="black", lw=0.5)
            fig.tight_layout()
            fig.savefig(out / f"gaps_{group}.png", dpi=120)
            plt.close(fig)


def gaps_during_training(runs: list[dict], key: str, base_of) -> dict[str, tuple[list[int], list[float]]]:
    """Row -> (steps, gap) for every row but the baselines: its validation gap to ``base_of(row)`` at every
    evaluation both logged, paired by seed, mean over the seeds (rows with fewer than 2 such evaluations: none)."""
    points = {(r["row"], r["seed"]): _points(r, key) for r in runs}
    out = {}
    for name in dict.fromkeys(r["row"] for r in runs):
        if name == base_of(name):
            continue
        per_step: dict[int, list[float]] = {}
        for r in (r for r in runs if r["row"] == name and (base_of(name), r["seed"]) in points):
            base = points[(base_of(name), r["seed"])]
            for step, v in _points(r, key).items():
                if step in base:
                    per_step.setdefault(step, []).append(v / base[step] - 1)
        if len(per_step) >= 2:
            steps = sorted(per_step)
            out[name] = (steps, [statistics.fmean(per_step[k]) for k in steps])
    return out


def _gap_curves(plt, runs: list[dict], names: list[str], group: str, key: str, path: Path,
                base_of=None) -> None:
    """gaps_during_training's curves (``base_of``: each row's baseline, default the group's): does the gap close as
    training goes on? No plot for a group evaluated only at the end."""
    curves = gaps_during_training(runs, key, base_of or (lambda _: BASELINE.get(group)))
    if not curves:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, name in enumerate(names):
        if name in curves:
            steps, gaps = curves[name]
            ax.plot(steps, [100 * g for g in gaps], label=name, marker=".", lw=1, **_style(plt, i))
    ax.axhline(0, color="black", lw=0.5)
    ax.set(xlabel="step", ylabel=f"{key} gap vs {BASELINE.get(group, 'baseline')} (%)",
           title=f"{group}: gap during training")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
