"""The recommended settings of a pipeline boundary's codec: the ONE source of MAPL's defaults.

The ``[pipeline]`` section of slimpar/config.py takes its codec fields' defaults from :data:`CODEC_DEFAULTS`, and so
does the pipeline library's factory ``CodecSpec.mapl`` (and ``MaplTrainingSpec`` SPEL's), so the CLI's MAPL and the
library's cannot drift apart. A module of its own, below config.py in the layers (pyproject.toml): config.py imports
nothing else of slimpar, and pipeline/ may not import config's run tree, only this record of constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RVQDefaults:
    """The recommended residual-VQ settings (``[pipeline.rvq]`` and ``CodecSpec.mapl``'s ``rvq_levels``)."""

    codebook: int = 256
    decay: float = 0.99
    commitment: float = 0.25
    sync_every: int = 50
    # 2: docs/results/rvq_update (the loss of updating every step within a seed's spread, 0.042 of none's forward
    # bytes; every 4 steps stalled one seed of three). 0 was the behaviour before issue 20
    update_every: int = 2
    dead_threshold: float = 1.0


@dataclass(frozen=True)
class SPELDefaults:
    """The recommended optimizer of MAPL's projector A (``[pipeline]``'s ``spel_*``, ``polar`` and ``clip_projector``,
    and the library's ``MaplTrainingSpec``): η a constant rotation budget of 0.001 a step, A's gradient clipped by
    its own norm (docs/methods.md, 'SPEL'; the evidence in docs/pipeline.md, 'Defaults')."""

    lr: float = 0.001  # η, SPEL's spectral step length
    momentum: float = 0.9  # β
    polar: str = "polar_express"  # msign backend: polar_express | eigh
    schedule: str = "constant"  # constant | model (the model's warm-up + cosine) | cosine (its own, no warm-up)
    clip: str = "separate"  # separate (A by its own norm) | global (in the model's norm) | none


@dataclass(frozen=True)
class CodecDefaults:
    """A boundary codec's recommended settings (module docstring). The evidence for each value: docs/pipeline.md,
    'Defaults' (the tuned quality study; docs/methods.md, 'Claims and measurements')."""

    anchors: str = "auto"  # factorized for MAPL, none for the other codecs (pipeline.spec.resolve_anchors)
    anchor_dim: int = 32
    anchor_form: str = "receiver"  # no anchor table crosses the boundary, and it measured at or below symmetric
    anchor_init: str = "embedding"
    ids: str = "local"  # every stage reads its own batch: no 2 bytes per token on the wire
    projector_init: str = "auto"  # pca for MAPL with r < d, the run's final r (pipeline.spec.resolve_projector_init)
    rvq: RVQDefaults = field(default_factory=RVQDefaults)
    spel: SPELDefaults = field(default_factory=SPELDefaults)


CODEC_DEFAULTS = CodecDefaults()
