"""The configurations ``slimpar plan --fit`` scores, each a list of ``slimpar train`` overrides.

The grid, for W = nodes x gpus_per_node workers (every candidate uses all of them):

- DDP and FSDP2, each with and without activation checkpointing (AC);
- block-level SDP at keeps 3/8 and 1/2 (the keeps the quality study measured), forward and backward
  regime, each alone, the forward regime also with 2-way FSDP2 (``sdp.fsdp 2``: it shards forward-masked
  subnetworks), each with and without AC;
- pipelines of P = 2, 4 and 8 stages (those that divide W; slimpar's pipelines have at most 8) times W / P
  replicas, with the most microbatches up to 2P that split a replica's batch, and codec none, MAPL 4x (every
  byte a boundary sends at most 1/4 of none's, as the tuned quality study measured it), MAPL 8x and MAPL 16x
  without and with RVQ (r = d / K: ``compression_of payload``, as the quality study measured them);
- the hybrid: 4-stage pipelines whose stage replicas run SDP at keep 1/2, with MAPL 4x.

A candidate that a config rule refuses (a batch that does not split, fewer layers than stages) is kept
with the rule's message, so the table says why it is not there.
"""

from __future__ import annotations

from dataclasses import dataclass

SDP_KEEPS = (0.375, 0.5)
_PAYLOAD = ("--pipeline.compression_of", "payload")  # r = d / K
CODECS: dict[str, tuple[str, ...]] = {
    "none": ("--pipeline.codec", "none"),
    "MAPL 4x": ("--pipeline.codec", "mapl", "--pipeline.compression", "4", "--pipeline.compression_of", "total"),
    "MAPL 8x": ("--pipeline.codec", "mapl", "--pipeline.compression", "8", *_PAYLOAD),
    "MAPL 16x": ("--pipeline.codec", "mapl", "--pipeline.compression", "16", *_PAYLOAD),
    "MAPL 16x + RVQ": ("--pipeline.codec", "mapl", "--pipeline.compression", "16", "--pipeline.rvq.levels", "2",
                       *_PAYLOAD),
}
_AC = ("--train.activation_checkpointing", "true")


@dataclass(frozen=True)
class Candidate:
    """One configuration: its name in the table, its family and the overrides that make it."""

    name: str
    family: str  # ddp | fsdp | sdp | pipeline | hybrid
    overrides: tuple[str, ...]
    evidence: str  # the key of its quality evidence (slimpar/plan/evidence.py)
    without_ac: str = ""  # an AC row: the row without it (AC only adds compute where that one fits)


def _with_ac(name: str, family: str, overrides: tuple[str, ...], evidence: str) -> list[Candidate]:
    return [Candidate(name, family, overrides, evidence),
            Candidate(name + " + AC", family, overrides + _AC, evidence, without_ac=name)]


def microbatches(batch: int, replicas: int, stages: int) -> int:
    """The most microbatches up to 2P that split a replica's batch (1F1B needs at least P); 2P where none does
    (the config rule then refuses the candidate and says why)."""
    per = batch // replicas
    return next((m for m in range(2 * stages, stages - 1, -1) if per and per % m == 0), 2 * stages)


def candidates(workers: int, gpus_per_node: int, batch: int) -> list[Candidate]:
    """The grid of the module docstring for ``workers`` workers, ``gpus_per_node`` to a node, a global batch of
    ``batch`` sequences."""
    out = _with_ac("DDP", "ddp", ("--parallel.mode", "ddp"), "exact")
    out += _with_ac("FSDP2", "fsdp", ("--parallel.mode", "fsdp"), "exact")
    for keep in SDP_KEEPS:
        for regime, short in (("forward", "B-SDP"), ("backward", "Bb-SDP")):
            base = ("--parallel.mode", "sdp", "--sdp.level", "block", "--sdp.keep", str(keep), "--sdp.regime", regime)
            name = f"{short} {_frac(keep)}"
            out += _with_ac(name, "sdp", base, f"sdp {regime} {keep}")
            if workers % 2 == 0 and workers >= 4 and regime == "forward":  # 2-D SDP shards forward subnetworks
                out += _with_ac(name + " + FSDP2 2", "sdp", base + ("--sdp.fsdp", "2"), f"sdp {regime} {keep}")
    for stages in (2, 4, 8):
        if stages > workers or workers % stages:
            continue
        for codec, flags in CODECS.items():
            out.append(Candidate(f"pipeline {stages} x {workers // stages}, {codec}", "pipeline",
                                 ("--parallel.mode", "pipeline", "--pipeline.stages", str(stages),
                                  "--pipeline.microbatches", str(microbatches(batch, workers // stages, stages)),
                                  *flags),
                                 f"pipeline {codec}"))
    if workers >= 8 and workers % 4 == 0:
        out.append(Candidate(f"hybrid: pipeline 4 x {workers // 4}, SDP 1/2 per stage, MAPL 4x", "hybrid",
                             ("--parallel.mode", "pipeline", "--pipeline.stages", "4",
                              "--pipeline.microbatches", str(microbatches(batch, workers // 4, 4)),
                              "--pipeline.dp", "sdp",
                              "--pipeline.sdp_keep", "0.5", *CODECS["MAPL 4x"]), "hybrid"))
    return out


def _frac(keep: float) -> str:
    return {0.375: "3/8", 0.5: "1/2", 0.25: "1/4", 0.75: "3/4"}.get(keep, f"{keep:g}")
