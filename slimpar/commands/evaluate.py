"""``slimpar eval --run DIR``: evaluate the exported full model of a finished run in one process.

A pipeline run's export (``model.safetensors``) also holds its boundary codecs' state under ``codecs.*``
(both ends of each boundary: ``codecs.send{s}.*`` and ``codecs.recv{s}.*``). By default the model is
evaluated without them, as a plain model; ``through_codecs`` evaluates it the way the pipeline trained
and validated it: every stage and codec in one process (slimpar.pipeline.virtual's local links, through
slimpar.pipeline.evaluate), results in ``eval_through_codecs.json`` instead of ``eval.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from slimpar.config import ConfigError, load_config
from slimpar.train.validate.checks import load_run_config

CODECS = "codecs."


def split_codec_state(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the model's tensors, the codecs' tensors without the ``codecs.`` prefix) of a run's export."""
    model = {k: v for k, v in state.items() if not k.startswith(CODECS)}
    return model, {k[len(CODECS):]: v for k, v in state.items() if k.startswith(CODECS)}


def evaluate_run(run_dir: Path, overrides: list[str] | None = None, through_codecs: bool = False) -> dict:
    """Rebuild the run's model from ``config.toml``, load ``model.safetensors``, evaluate every split."""
    cfg_path, weights = run_dir / "config.toml", run_dir / "model.safetensors"
    for p in (cfg_path, weights):
        if not p.is_file():
            raise ConfigError(f"{p} not found: --run must be a finished `slimpar train` folder with an export "
                              "(checkpoint.export = true)")
    from slimpar.train.checkpoint.export import verify_export

    verify_export(run_dir)  # model.safetensors against the run's manifest.json, before anything reads it
    trained = load_config(cfg_path, overrides)  # the run's own settings (its processes and replicas)
    pipeline = trained.parallel.mode == "pipeline"
    if through_codecs and not pipeline:
        raise ConfigError(f"{run_dir} is not a pipeline run (no boundary codecs): evaluate without --through-codecs")
    # one process on the CPU, where the model is built and evaluated: a GPU run's config.toml says cuda and nccl
    here = ["--parallel.mode", "single", "--parallel.workers", "1", "--parallel.device", "cpu", "--parallel.backend",
            "gloo"]
    cfg = load_run_config(cfg_path, here + (overrides or []))
    from slimpar.train.build import build_data, build_model
    from slimpar.train.checkpoint.init_from import check_init_from

    check_init_from(cfg, run_dir)  # build_model reads the init_from folder's shape and weights
    from slimpar.train.checkpoint.export import load_safetensors

    state, codecs = split_codec_state(load_safetensors(weights))
    data = build_data(cfg)
    model = build_model(cfg, data)  # the run's initial model: a pipeline's anchors and SSN tables start from it
    if through_codecs:
        results, name = _through_codecs(cfg, trained, model, data, state, codecs), "eval_through_codecs.json"
    else:
        from slimpar.train.evaluate import evaluate
        from slimpar.train.strategies.base import Strategy

        check_shapes(model, state, run_dir)
        model.load_state_dict(state, strict=True)
        results, name = evaluate(Strategy(model), data, cfg, rank=0, world=1), "eval.json"
    (run_dir / name).write_text(json.dumps(results, indent=2))
    for k, v in results.items():
        print(f"{k:>28s}  {v:.4f}")
    if pipeline and not through_codecs:
        print("note: evaluated without the pipeline's boundary codecs; --through-codecs evaluates through them "
              "(the quality the pipeline trained)")
    return results


def check_shapes(model: torch.nn.Module, state: dict[str, torch.Tensor], run_dir: Path) -> None:
    """ConfigError (exit 2) when the export's tensors do not fit the model the config builds: an override
    such as ``--model.size`` names another model than the one the run trained."""
    mine = model.state_dict()
    names = sorted(set(mine) ^ set(state))
    shapes = [f"{k}: export {tuple(state[k].shape)}, model {tuple(mine[k].shape)}"
              for k in sorted(set(mine) & set(state)) if state[k].shape != mine[k].shape]
    if names or shapes:
        detail = "; ".join((shapes + [f"{k} only in {'the export' if k in state else 'the model'}" for k in names])[:3])
        raise ConfigError(f"{run_dir}/model.safetensors does not fit the model these settings build ({detail}); "
                          "evaluate with the run's own settings: drop the --model.* overrides")


def codecs_as_trained(trained, vocab: int) -> list:
    """The run's codec specs from its own settings, ``trained``: with ``compression_of = total`` r follows the
    rows a replica's microbatch carries, so it must not be read from the one-process config evaluation runs."""
    from slimpar.train.run_plan import run_plan

    return run_plan(trained, vocab).codecs


def _through_codecs(cfg, trained, model, data, state: dict[str, torch.Tensor], codecs: dict[str, torch.Tensor]) -> dict:
    """Every stage of the run's pipeline in this process (``cfg``: one process on the CPU), the export's weights and
    codec state loaded into the codecs the run trained (``trained``: its own settings)."""
    from slimpar.pipeline.evaluate import evaluate_pipeline
    from slimpar.pipeline.ssn import load_effective_state_dict
    from slimpar.pipeline.virtual import VirtualPipeline, load_codec_state
    from slimpar.pipeline.wire import ByteCounter
    from slimpar.train.build import loss_fn
    from slimpar.train.evaluate import val_splits
    from slimpar.train.strategies.pipeline import build_run_stages

    specs = codecs_as_trained(trained, model.cfg.vocab_size)
    stages = build_run_stages(cfg, model, specs, list(range(cfg.pipeline.stages)), "cpu")  # as the model: on the CPU
    for stage in stages:
        load_effective_state_dict(stage.model, state)
    try:
        load_codec_state(stages, codecs)
    except ValueError as e:  # the export's codecs are not the ones these settings build: the user's input
        raise ConfigError(f"{e}; evaluate with the run's own settings (drop the --pipeline.* overrides)") from None
    counter = ByteCounter()
    links = VirtualPipeline(stages, counter, loss_fn, cfg.pipeline.sync_dtype).links  # (sender, receiver) ends
    return evaluate_pipeline(stages, {p: pair[1] for p, pair in enumerate(links)},
                             {p: pair[0] for p, pair in enumerate(links)}, counter, val_splits(data, cfg),
                             data.target_bytes)
