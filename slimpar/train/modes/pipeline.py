"""Pipeline parallelism (MAPL codecs at the stage boundaries): each rank holds one stage of one replica."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slimpar.config import ConfigError
from slimpar.train.modes.base import Mode

if TYPE_CHECKING:
    from slimpar.config import Config


class Pipeline(Mode):
    name = "pipeline"
    section = "pipeline"
    tied = ("stages", "codec", "rank", "compression", "compression_of", "anchors", "anchor_dim", "anchor_form",
            "virtual", "rvq.levels", "rvq.codebook", "dp", "sdp_keep")
    why_not_model_scope = "a pipeline's stages and codecs run block by block"

    def reads(self, cfg: Config) -> tuple[str, ...]:
        if cfg.pipeline.dp != "sdp":
            return ("pipeline",)
        return ("pipeline", "sdp.assignment", "sdp.min_holders", "sdp.check_every")  # the stage replicas' SDP plans

    def kind(self, cfg: Config) -> str:
        pc = cfg.pipeline
        return "pipeline-virtual" if pc.virtual else "pipeline-sdp" if pc.dp == "sdp" else "pipeline"

    def data_parallel(self, cfg: Config) -> int:
        return max(1, cfg.parallel.workers // max(cfg.pipeline.stages, 1))

    def in_process(self, cfg: Config) -> bool:
        return cfg.pipeline.virtual

    def refits_accumulation(self, cfg: Config) -> bool:
        return False  # microbatches replace gradient accumulation

    def checkpoint_names(self, cfg: Config) -> str:
        return "pipeline-full"

    def layout(self, cfg: Config) -> dict:
        """The tied settings, the blocks' cuts and the codec's own settings as its kind declares them, resolved
        (defaults filled in, typed: "k=8" and "k = 8" are one layout; none for the built-in kinds)."""
        from dataclasses import asdict

        from slimpar.pipeline.codec_kinds import codec_settings

        out = super().layout(cfg)
        out["cuts"] = self.cuts(cfg)
        settings = codec_settings(cfg.pipeline.codec, cfg.pipeline.codec_options)
        if settings is not None:
            out["codec_options"] = asdict(settings)
        return out

    def keep(self, cfg: Config, layout: dict, saved: dict) -> str:
        """The checkpoint's codec rank r where a cut is kept: an automatic ``pipeline.rank`` becomes it (with
        ``compression_of = total`` r follows a replica's rows per microbatch, so an elastic restart on fewer workers
        would choose another r and could not load the codecs it trained); another explicit one is refused."""
        r, pc = saved.get("r"), cfg.pipeline
        if r is None or layout.get("pipeline", {}).get("codec") != pc.codec:
            return ""  # no projector saved, or another codec (refused by name in check_layout)
        if not set(layout.get("pipeline", {}).get("cuts", [])) & set(self.cuts(cfg)):
            return ""  # every codec restarts at new cuts
        if pc.rank and pc.rank != r:
            raise ConfigError(f"the checkpoint's codecs have rank r = {r}, this run asks --pipeline.rank {pc.rank} "
                              f"at a cut it keeps; --pipeline.rank {r} (or leaving it automatic) keeps them, or "
                              "start over with --fresh (or another --out)")
        if pc.rank:
            return ""
        pc.rank = r
        return (f"note: the pipeline keeps its checkpoint's codec rank r = {r} (pipeline.rank is automatic: with "
                "compression_of total r follows a replica's rows per microbatch, which another worker count changes)")

    def layout_text(self, layout: dict) -> str:
        tied = layout.get("pipeline", {})
        return f"pipeline ({tied.get('stages')} stages, codec {tied.get('codec')})"

    def cuts(self, cfg: Config) -> list[int]:
        """The last block before each boundary (``slimpar.pipeline.names.cut_blocks``)."""
        from slimpar.pipeline.names import cut_blocks
        from slimpar.train.build import llama_config

        return cut_blocks(llama_config(cfg).n_layers, cfg.pipeline.stages)

    def state_bytes(self, run, total: int) -> list[int]:
        """A stage's blocks (``pipeline.dp = "sdp"``: ``sdp_keep`` of them), the embedding on the first stage, the
        norm and head on the last (a tied embedding on both); a virtual pipeline is one process."""
        from slimpar.pipeline.split import stage_ranges
        from slimpar.train.build import llama_config

        cfg = run.cfg
        pc, workers = cfg.pipeline, cfg.parallel.workers
        if pc.virtual:
            return [4 * total]
        ranges = stage_ranges(llama_config(cfg).n_layers, pc.stages)
        keep = pc.sdp_keep if pc.dp == "sdp" else 1.0
        stage = [0] * pc.stages
        for name, nbytes in run.param_bytes:
            if name.startswith("layers."):
                block = int(name.split(".")[1])
                stage[next(s for s, r in enumerate(ranges) if block in r)] += int(nbytes * keep)
                continue
            first = name.startswith("tok_embeddings")
            for s in {0 if first else pc.stages - 1, *((pc.stages - 1,) if first and cfg.model.tie_embeddings else ())}:
                stage[s] += nbytes
        return [4 * stage[r % pc.stages] for r in range(workers)]

    def holds_logits(self, cfg: Config, rank: int) -> bool:
        pc = cfg.pipeline
        return pc.virtual or rank % pc.stages == (cfg.parallel.workers - 1) % pc.stages

    def held(self, cfg: Config) -> str:
        return "every stage" if cfg.pipeline.virtual else "its pipeline stage's parameters"

    def heaviest_ranks(self, run) -> list[int]:
        """The first stage (the embedding, the most blocks of an uneven split, under 1F1B the most microbatches in
        flight) and the last (the head and the logits); a middle stage holds no more than the first."""
        return sorted({0, run.cfg.pipeline.stages - 1})

    def worker_step(self, cfg: Config) -> int:
        return cfg.pipeline.stages

    def check_backend(self, cfg: Config) -> None:
        p = cfg.parallel
        if p.backend == "gloo" and p.device == "cuda" and not cfg.pipeline.virtual:
            raise ConfigError("pipeline stages on GPUs send activations point to point, which gloo does from host "
                              "memory only: use --parallel.backend nccl (one GPU per stage), --pipeline.virtual "
                              "true (every stage in one process), or --parallel.device cpu")
