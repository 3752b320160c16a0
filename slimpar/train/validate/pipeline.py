"""Start-up checks for ``parallel.mode = "pipeline"``: every message names the fix.

Called by slimpar.train.validate.checks before any process or group exists; the model's width and depth come
from the named size (the vocabulary is not known yet and is checked where the model is built).
"""

from __future__ import annotations

from slimpar.config import Config, ConfigError
from slimpar.config import check_choice as _choice
from slimpar.optim.spel import SPEL_SCHEDULES
from slimpar.pipeline.codec_kinds import CODEC_KINDS, codec_settings, names
from slimpar.pipeline.spec import resolve_anchors, resolve_rank
from slimpar.pipeline.sync import SYNC_DTYPES
from slimpar.pipeline.training import CLIP_MODES
from slimpar.train.build import llama_config
from slimpar.train.validate.ranges import Range

MAX_STAGES = 8
MAX_CODEBOOK = 1 << 16

# The [pipeline] numbers, checked in every mode by slimpar.train.validate.checks.check_numbers; the layout and
# codec rules below (which need the model and parallel.mode = "pipeline") refine them.
PIPELINE_RANGES: dict[str, Range] = {
    "pipeline.stages": Range(1), "pipeline.microbatches": Range(1),
    "pipeline.rank": Range(0, why="0 = fitted to pipeline.compression"), "pipeline.compression": Range(1),
    "pipeline.anchor_dim": Range(1),
    "pipeline.spel_lr": Range(0, lo_open=True, why="SPEL's spectral step length"),
    "pipeline.spel_momentum": Range(0, 1, hi_open=True, why="SPEL's momentum"),
    "pipeline.checksum_every": Range(0, why="0 = never"),
    "pipeline.pca_batches": Range(1, why="training batches for the pca start"),
    "pipeline.freeze_projector_after": Range(0, why="0 = never"),
    "pipeline.sdp_keep": Range(0, 1, lo_open=True, why="fraction of a stage's blocks each replica holds"),
    "pipeline.rvq.levels": Range(0, why="0 = no RVQ"), "pipeline.rvq.codebook": Range(2),
    "pipeline.rvq.decay": Range(0, 1, hi_open=True, why="EMA decay of the codebooks"),
    "pipeline.rvq.commitment": Range(0), "pipeline.rvq.sync_every": Range(0),
    "pipeline.rvq.dead_threshold": Range(0, why="0 = never re-seed unused codes"),
    "pipeline.rvq.update_every": Range(0, why="0 = update the codebook after every microbatch"),
}


def validate_pipeline(cfg: Config) -> None:
    """Raise ConfigError for the first impossible pipeline setting."""
    if cfg.model.arch != "llama":
        raise ConfigError(f"parallel.mode = 'pipeline' splits LLaMA models into stages; model.arch = "
                          f"{cfg.model.arch!r} is not supported (use --model.arch llama)")
    lc = llama_config(cfg)
    _check_choices(cfg)
    _check_layout(cfg, lc.n_layers)
    _check_codec(cfg, lc.dim)
    _check_rvq(cfg)
    _check_budget(cfg, lc.dim)
    _check_projector(cfg)
    _check_hybrid(cfg)
    if lc.tie_embeddings and CODEC_KINDS[cfg.pipeline.codec].token_table:
        raise ConfigError(f"codec {cfg.pipeline.codec!r} replaces the token embedding by a fixed random table plus a "
                          "subspace part, which the output head cannot share; add --model.tie_embeddings false")
    if cfg.train.grad_accum != 1:
        raise ConfigError("pipeline microbatches replace gradient accumulation; set --train.grad_accum 1 and "
                          "use --pipeline.microbatches")


def _check_choices(cfg: Config) -> None:
    pc = cfg.pipeline
    _choice("pipeline.schedule", pc.schedule, ("gpipe", "1f1b"))
    _choice("pipeline.codec", pc.codec, tuple(CODEC_KINDS))
    _choice("pipeline.anchors", pc.anchors, ("auto", "none", "factorized", "full"))
    _choice("pipeline.anchor_form", pc.anchor_form, ("symmetric", "receiver"))
    _choice("pipeline.ids", pc.ids, ("send", "local"))
    _choice("pipeline.polar", pc.polar, ("polar_express", "eigh"))
    _choice("pipeline.sync_dtype", pc.sync_dtype, SYNC_DTYPES)
    _choice("pipeline.tied_sync_dtype", pc.tied_sync_dtype, SYNC_DTYPES)
    _choice("pipeline.projector_init", pc.projector_init, ("auto", "random", "pca"))
    _choice("pipeline.spel_schedule", pc.spel_schedule, SPEL_SCHEDULES)
    _choice("pipeline.clip_projector", pc.clip_projector, CLIP_MODES)
    _choice("pipeline.anchor_init", pc.anchor_init, ("embedding", "zero"))
    _choice("pipeline.dp", pc.dp, ("ddp", "sdp"))


def _check_layout(cfg: Config, n_layers: int) -> None:
    pc, workers = cfg.pipeline, cfg.parallel.workers
    if not 2 <= pc.stages <= MAX_STAGES:
        raise ConfigError(f"pipeline.stages must be between 2 and {MAX_STAGES}, got {pc.stages}")
    if pc.stages > n_layers:
        raise ConfigError(f"pipeline.stages = {pc.stages} is more than the model's {n_layers} blocks "
                          "(at most one stage per block); lower --pipeline.stages")
    if pc.virtual and workers != 1:
        raise ConfigError("pipeline.virtual = true runs every stage in one process; set --parallel.workers 1")
    if not pc.virtual and (workers < pc.stages or workers % pc.stages):
        raise ConfigError(f"parallel.workers = {workers} must be a multiple of pipeline.stages = {pc.stages} "
                          "(one process per stage and replica); or run in one process with --pipeline.virtual true")
    replicas = 1 if pc.virtual else workers // pc.stages
    if pc.microbatches < 1:
        raise ConfigError(f"pipeline.microbatches must be >= 1, got {pc.microbatches}")
    per_replica = cfg.train.batch_size // replicas
    if cfg.train.batch_size % replicas or per_replica % pc.microbatches:
        raise ConfigError(f"pipeline.microbatches = {pc.microbatches} must divide the per-replica batch "
                          f"({cfg.train.batch_size} / {replicas} replicas = {cfg.train.batch_size / replicas:g})")
    if pc.schedule == "1f1b" and pc.microbatches < pc.stages:
        raise ConfigError(f"the 1F1B schedule needs pipeline.microbatches >= pipeline.stages "
                          f"({pc.microbatches} < {pc.stages}); raise --pipeline.microbatches or use gpipe")


def _check_codec(cfg: Config, d: int) -> None:
    pc = cfg.pipeline
    _choice("pipeline.compression_of", pc.compression_of, ("payload", "total"))
    if pc.rank < 0 or pc.compression < 1:
        raise ConfigError(f"pipeline.rank must be >= 0 and pipeline.compression >= 1, got {pc.rank}, {pc.compression}")
    kind = CODEC_KINDS[pc.codec]
    try:  # the kind's own settings, as it declares and checks them (codec_registry.codec_settings)
        codec_settings(pc.codec, pc.codec_options, d)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"pipeline.codec_options = {pc.codec_options!r}: {e}") from None
    if kind.projects:
        if pc.rank > d:
            raise ConfigError(f"pipeline.rank = {pc.rank} is larger than the model width d = {d}; choose r <= d")
        if not pc.rank and pc.compression_of == "payload":  # r = d / K
            if d % pc.compression:
                raise ConfigError(f"pipeline.compression = {pc.compression} with compression_of = 'payload' (r = d / "
                                  f"K) does not divide d = {d}; set --pipeline.rank r instead")
            if resolve_rank(pc.codec, d, pc.rank, pc.compression) < 1:
                raise ConfigError(f"pipeline.compression = {pc.compression} leaves rank 0 for d = {d}")
    anchors = resolve_anchors(pc.codec, pc.anchors)
    if anchors != "none":
        if not kind.learned:
            why = "has its own fixed token table" if kind.token_table else "has no projector"
            raise ConfigError(f"pipeline.anchors = {pc.anchors!r} needs a learned projector codec "
                              f"({_either(names(lambda k: k.learned))}); codec {pc.codec!r} {why}")
        if anchors == "factorized" and not 0 < pc.anchor_dim <= d:
            raise ConfigError(f"pipeline.anchor_dim = {pc.anchor_dim} must be between 1 and d = {d}")
    if pc.spel_lr <= 0 or not 0 <= pc.spel_momentum < 1:
        raise ConfigError(f"pipeline.spel_lr must be > 0 and spel_momentum in [0, 1), got {pc.spel_lr}, "
                          f"{pc.spel_momentum}")
    if pc.checksum_every < 0:
        raise ConfigError(f"pipeline.checksum_every must be >= 0 (0 = never), got {pc.checksum_every}")


def _check_budget(cfg: Config, d: int) -> None:
    """``compression_of = total`` (the default) without a rank: some r must keep every byte <= 1/K of none's."""
    pc = cfg.pipeline
    if pc.compression_of == "total" and not pc.rank and CODEC_KINDS[pc.codec].projects:
        from slimpar.train.run_plan import run_plan

        _ = run_plan(cfg).codecs  # r is decided there, once: ConfigError when no rank fits the budget


def _check_rvq(cfg: Config) -> None:
    pc, q = cfg.pipeline, cfg.pipeline.rvq
    if q.levels < 0:
        raise ConfigError(f"pipeline.rvq.levels must be >= 0 (0 = no RVQ), got {q.levels}")
    if not q.levels:
        return
    if not CODEC_KINDS[pc.codec].projects:
        raise ConfigError(f"RVQ quantizes projected codes: pipeline.rvq.levels > 0 needs codec "
                          f"{_either(names(lambda k: k.projects))} (got {pc.codec!r})")
    if not 2 <= q.codebook <= MAX_CODEBOOK:
        raise ConfigError(f"pipeline.rvq.codebook = {q.codebook} must be between 2 and {MAX_CODEBOOK:,}")
    if not 0 <= q.decay < 1 or q.commitment < 0 or q.sync_every < 0:
        raise ConfigError("pipeline.rvq needs decay in [0, 1), commitment >= 0 and sync_every >= 0")


def _check_projector(cfg: Config) -> None:
    """How MAPL's projector A is started and stepped (docs/pipeline.md, "Starting and stepping A")."""
    pc = cfg.pipeline
    if pc.pca_batches < 1:
        raise ConfigError(f"pipeline.pca_batches must be >= 1, got {pc.pca_batches}")
    if pc.freeze_projector_after < 0:
        raise ConfigError(f"pipeline.freeze_projector_after must be >= 0 (0 = never), got {pc.freeze_projector_after}")
    if pc.projector_init == "pca" and not CODEC_KINDS[pc.codec].stiefel:
        stiefel = names(lambda k: k.stiefel)
        raise ConfigError(f"pipeline.projector_init = 'pca' starts MAPL's Stiefel projector A; codec {pc.codec!r} "
                          f"has none (use --pipeline.codec {stiefel[0]}, or --pipeline.projector_init random)")


def _check_hybrid(cfg: Config) -> None:
    """SDP inside the stages (docs/pipeline.md, "Hybrid: SDP inside pipeline stages")."""
    pc = cfg.pipeline
    if pc.dp == "ddp" and pc.sdp_keep != 1:
        raise ConfigError(f"pipeline.sdp_keep = {pc.sdp_keep:g} applies to SDP inside the stages; "
                          "add --pipeline.dp sdp")
    if pc.dp == "sdp" and pc.virtual:
        raise ConfigError("pipeline.dp = 'sdp' shares a stage's blocks among its data-parallel replicas, and "
                          "pipeline.virtual = true runs one replica in one process; use --parallel.workers stages × R")
    if pc.dp == "sdp" and cfg.sdp.assignment == "explicit":
        raise ConfigError("pipeline.dp = 'sdp' plans every stage over its replicas (cyclic or random); "
                          "sdp.assignment = 'explicit' is not supported there")


def _either(options: list[str]) -> str:
    """The options as prose: ``a``, ``a or b``, ``a, b or c``."""
    return options[0] if len(options) == 1 else f"{', '.join(options[:-1])} or {options[-1]}"
