"""``slimpar plan --fit``: every candidate configuration scored on a cluster, ranked by an objective.

For each candidate of slimpar/plan/candidates.py, on the cluster's W workers:

1. the config it makes is validated as ``slimpar train`` would (a refused one is kept with the reason);
2. its FLOPs and bytes per step per link class (slimpar/plan/workload.py, traffic.py) give its step time
   (steptime.py) and tokens per second;
3. its loss gap against DDP at the run's tokens per parameter comes from the committed quality studies
   (evidence.py), or "no evidence";
4. its peak memory per worker is predicted by the fake-tensor step of ``slimpar plan --memory``
   (memory.py); it fits when the peak is at most ``1 - fit.memory_margin`` of the worker's memory (the rest
   is left to the CUDA context, the allocator's fragmentation and the communication buffers). Predictions go
   in the objective's order of the modelled scores until ``fit.top`` candidates fit (each costs seconds at 1B).

Objectives: ``time`` ranks the fitting candidates by step time; ``time_at_quality`` the same among those
whose predicted gap (plus its spread) is at most ``fit.max_gap``, then the rest; ``memory`` by peak.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from slimpar.config import Config, ConfigError, check_choice, with_overrides
from slimpar.plan.candidates import Candidate, candidates
from slimpar.plan.cluster import Cluster
from slimpar.plan.evidence import Gap, predict_gap
from slimpar.plan.shape import shape_of
from slimpar.plan.steptime import step_seconds
from slimpar.plan.workload import workload
from slimpar.train.modes import mode_of

OBJECTIVES = ("time", "time_at_quality", "memory")


@dataclass
class FitConfig:
    """``--fit.*``: how candidates are ranked."""

    objective: str = "time"  # time | time_at_quality (fastest within fit.max_gap) | memory (smallest peak)
    max_gap: float = 0.02  # time_at_quality: the largest predicted relative loss gap to DDP (0.02 = 2%)
    tokens: float = 0.0  # tokens the run trains on (its tokens per parameter); 0 = train.steps x batch x seq_len
    memory_margin: float = 0.1  # a candidate fits when its peak is <= (1 - margin) x the worker's memory
    jobs: int = 2  # processes predicting memory
    top: int = 10  # predict memory, fastest first, until this many fit; 0 = every candidate (objective memory: all)
    candidates: str = ""  # only these comma-separated candidates and the rows they start ("DDP": DDP, DDP + AC)


@dataclass
class Scored:
    """One candidate's row."""

    candidate: Candidate
    config: Config | None
    error: str = ""  # the config rule that refuses it, or why its memory could not be predicted
    peak: int | None = None  # bytes, the largest over the workers predicted
    peaks: dict[int, int] = field(default_factory=dict)  # rank -> bytes
    bytes_intra: float = 0.0  # per step, the busiest worker's bytes to workers of its node
    bytes_inter: float = 0.0  # per step, the busiest node's bytes out of it
    compute_s: float = 0.0
    step_s: float = 0.0
    tokens_per_s: float = 0.0
    gap: Gap | None = None
    fits: bool = False
    why: str = ""

    def as_dict(self) -> dict:
        g = self.gap
        return {"name": self.candidate.name, "family": self.candidate.family, "fits": self.fits, "why": self.why,
                "peak_bytes": self.peak, "peak_bytes_by_rank": self.peaks, "bytes_intra": self.bytes_intra,
                "bytes_inter": self.bytes_inter, "compute_s": self.compute_s, "step_s": self.step_s,
                "tokens_per_s": self.tokens_per_s, "overrides": list(self.candidate.overrides),
                "gap": None if g is None else dataclasses.asdict(g), "error": self.error}


def check_fit(fc: FitConfig) -> None:
    check_choice("fit.objective", fc.objective, OBJECTIVES)
    if not 0 <= fc.memory_margin < 1:
        raise ConfigError(f"fit.memory_margin = {fc.memory_margin}: a fraction in [0, 1)")
    if fc.max_gap < 0 or fc.tokens < 0 or fc.jobs < 1 or fc.top < 0:
        bad = "max_gap" if fc.max_gap < 0 else "tokens" if fc.tokens < 0 else "jobs" if fc.jobs < 1 else "top"
        raise ConfigError(f"fit.{bad} = {getattr(fc, bad)}: must be {'>= 1' if bad == 'jobs' else '>= 0'}")


def candidate_config(base: Config, cand: Candidate, cluster: Cluster) -> Config:
    """The run config of ``cand`` on ``cluster``, validated as ``slimpar train`` validates it (but for the machine:
    a plan is made for another one)."""
    from slimpar.train.validate.checks import validate

    cfg = with_overrides(base, ["--parallel.workers", str(cluster.workers), "--parallel.device", "cpu",
                                "--parallel.backend", "gloo", *cand.overrides])
    validate(cfg, training=True, data=False, machine=False)
    return cfg


def fit(base: Config, cluster: Cluster, fc: FitConfig | None = None,
        progress: Callable[[str, int, int], None] | None = None) -> list[Scored]:
    """Every candidate scored and ranked (module docstring); ``progress(name, done, total)`` after each."""
    fc = fc or FitConfig()
    check_fit(fc)
    if base.model.arch != "llama":
        raise ConfigError(f"plan --fit plans LLaMA models (model.arch = 'llama'), not {base.model.arch!r}")
    shape = shape_of(base)
    tokens = fc.tokens or base.train.steps * base.train.batch_size * base.data.seq_len
    rows = [_score(base, c, cluster, tokens / shape.params) for c in _chosen(fc, cluster, base.train.batch_size)]
    total, done = len(rows), 0

    def tick(name: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(name, done, total)

    for r in rows:
        if r.config is None:
            tick(r.candidate.name)
    _predict_in_order(rows, cluster, fc, tick)
    return rank(rows, fc)


def _predict_in_order(rows: list[Scored], cluster: Cluster, fc: FitConfig, tick) -> None:
    """Memory for the rows in the objective's order of the modelled scores, ``fc.jobs`` at a time, until
    ``fc.top`` fit (0: all); an AC row only where the row without AC does not fit (AC only adds compute)."""
    from slimpar.plan.memory import Predictor

    by_name = {r.candidate.name: r for r in rows}
    order = sorted((r for r in rows if r.config is not None), key=lambda r: _key(r, fc, modelled=True))
    with Predictor(fc.jobs) as predictor:
        while order:
            if fc.top and fc.objective != "memory" and sum(r.fits for r in rows) >= fc.top:
                break
            wave = []
            while order and len(wave) < fc.jobs:
                r = order.pop(0)
                base = by_name.get(r.candidate.without_ac)
                if base is not None and base.fits and fc.objective != "memory":
                    r.why = f"not predicted: {base.candidate.name} fits without AC (AC only adds a forward's compute)"
                    tick(r.candidate.name)
                elif base is not None and base.peak is None and not base.error and fc.objective != "memory":
                    order.insert(0, r)  # its base is in this wave: wait for it
                    break
                else:
                    wave.append(r)
            if not wave and not order:
                break
            if not wave:  # never wait on a row that is not coming
                wave.append(order.pop(0))
            memory = predictor.predict({r.candidate.name: r.config for r in wave}, tick)
            for r in wave:
                _fit_memory(r, memory[r.candidate.name], cluster, fc.memory_margin)
    for r in order:
        base = by_name.get(r.candidate.without_ac)
        r.why = (f"not predicted: {base.candidate.name} fits without AC (AC only adds a forward's compute)"
                 if base is not None and base.fits else
                 f"not predicted: {fc.top} faster candidate(s) fit (--fit.top 0 predicts every row)")
        tick(r.candidate.name)


def _chosen(fc: FitConfig, cluster: Cluster, batch: int) -> list[Candidate]:
    words = [w.strip().lower() for w in fc.candidates.split(",") if w.strip()]
    every = candidates(cluster.workers, cluster.gpus_per_node, batch)
    chosen = [c for c in every if not words or any(_named(c.name.lower(), w) for w in words)]
    if not chosen:
        raise ConfigError(f"fit.candidates = {fc.candidates!r} matches none of: {', '.join(c.name for c in every)}")
    return chosen


def _named(name: str, word: str) -> bool:
    """``word`` names ``name`` or a row it starts ("DDP" picks "DDP" and "DDP + AC", not "Bb-DDP")."""
    return name == word or name.startswith(word + " ") or name.startswith(word + ",")


def _score(base: Config, cand: Candidate, cluster: Cluster, tokens_per_param: float) -> Scored:
    try:
        cfg = candidate_config(base, cand, cluster)
    except ConfigError as e:
        return Scored(cand, None, error=str(e), why=f"refused: {e}")
    w = workload(cfg, cluster)
    layout_2d = mode_of(cfg).gathers_parameters(cfg)
    t = step_seconds(w, cluster, layout_2d, cfg.pipeline.schedule)
    tokens = cfg.train.batch_size * cfg.data.seq_len
    return Scored(cand, cfg, bytes_intra=w.traffic.total.intra_max, bytes_inter=w.traffic.total.inter_max,
                  compute_s=t["compute"], step_s=t["step"], tokens_per_s=tokens / t["step"],
                  gap=predict_gap(cand.evidence, tokens_per_param))


def _fit_memory(r: Scored, rows: list[dict] | str, cluster: Cluster, margin: float) -> None:
    if isinstance(rows, str):
        r.error, r.why = rows, rows
        return
    r.peaks = {row["rank"]: row["peak_live"] for row in rows}
    r.peak = max(r.peaks.values())
    limit = (1 - margin) * cluster.gpu_memory
    r.fits = r.peak <= limit
    if not r.fits:
        r.why = f"needs {r.peak / 1024**3:.1f} GiB of {limit / 1024**3:.1f} GiB usable"


def _within(r: Scored, max_gap: float) -> bool:
    g = r.gap
    return g is not None and g.gap is not None and g.gap + (g.std or 0.0) <= max_gap


def _key(r: Scored, fc: FitConfig, modelled: bool = False):
    """The objective's sort key; ``modelled``: before memory is known (every row counted as fitting)."""
    if r.config is None:
        return (4, 0.0)
    if not modelled and r.peak is None:
        return (3, r.step_s)
    if not modelled and not r.fits:
        return (2, r.peak)
    if fc.objective == "memory":
        return (0, r.peak if not modelled else 0.0)
    if fc.objective == "time_at_quality" and not _within(r, fc.max_gap):
        return (1, r.step_s)
    return (0, r.step_s)


def rank(rows: list[Scored], fc: FitConfig) -> list[Scored]:
    """Fitting rows first, ordered by the objective; then the rows that do not fit, those whose memory was not
    predicted, and the refused ones."""
    return sorted(rows, key=lambda r: _key(r, fc))


def fit_model(model: str | Config, cluster: Cluster, tokens_per_step: int | None = None, *, seq_len: int | None = None,
              fc: FitConfig | None = None, progress: Callable[[str, int, int], None] | None = None) -> list[Scored]:
    """:func:`fit` for a LLaMA size name (``"134m"``, ``"1b"``, ...) or a run config, with the global batch given
    in tokens per step (rounded down to whole sequences of ``seq_len``; default: the config's batch)."""
    from slimpar.config import load_config

    cfg = load_config(None, ["--model.size", model]) if isinstance(model, str) else model
    over = []
    if seq_len:
        over += ["--data.seq_len", str(seq_len), "--model.max_seq_len", str(max(seq_len, 1))]
    if tokens_per_step:
        t = seq_len or cfg.data.seq_len
        if tokens_per_step < t:
            raise ConfigError(f"tokens_per_step = {tokens_per_step} is less than one sequence of {t} tokens")
        over += ["--train.batch_size", str(tokens_per_step // t)]
    return fit(with_overrides(cfg, over), cluster, fc, progress)
