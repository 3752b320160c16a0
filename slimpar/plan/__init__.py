"""``slimpar plan --fit`` as a library: the configurations of a LLaMA on a cluster, scored and ranked.

    from slimpar.plan import Cluster, ClusterConfig, fit_model, resolve_cluster

    cluster = resolve_cluster(ClusterConfig(preset="h100", nodes=2, inter_gbps=10))
    rows = fit_model("1b", cluster, tokens_per_step=524_288, seq_len=2048)
    best = rows[0]  # the fastest that fits: best.candidate.overrides are its slimpar train flags

docs/planning.md describes the models behind every column.
"""

from __future__ import annotations

from slimpar.plan.candidates import Candidate, candidates
from slimpar.plan.cluster import PRESETS, Cluster, ClusterConfig, resolve_cluster
from slimpar.plan.evidence import Gap, predict_gap
from slimpar.plan.fit import FitConfig, Scored, fit, fit_model

__all__ = ["Candidate", "Cluster", "ClusterConfig", "FitConfig", "Gap", "PRESETS", "Scored", "candidates", "fit",
           "fit_model", "predict_gap", "resolve_cluster"]
