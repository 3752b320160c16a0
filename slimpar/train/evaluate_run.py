"""``slimpar eval --run DIR``: evaluate the exported full model of a finished run in one process."""

from __future__ import annotations

import json
from pathlib import Path

from slimpar.config import ConfigError
from slimpar.train.validate import load_run_config


def evaluate_run(run_dir: Path, overrides: list[str] | None = None) -> dict:
    """Rebuild the run's model from ``config.toml``, load ``model.safetensors``, evaluate every split."""
    cfg_path, weights = run_dir / "config.toml", run_dir / "model.safetensors"
    for p in (cfg_path, weights):
        if not p.is_file():
            raise ConfigError(f"{p} not found: --run must be a finished `slimpar train` folder with an export "
                              "(checkpoint.export = true)")
    from slimpar.train.checkpoint import verify_export

    verify_export(run_dir)  # model.safetensors against the run's manifest.json, before anything reads it
    cfg = load_run_config(cfg_path, ["--parallel.mode", "single", "--parallel.workers", "1"] + (overrides or []))
    from slimpar.train.build import build_data, build_model
    from slimpar.train.init_from import check_init_from

    check_init_from(cfg, run_dir)  # build_model reads the init_from folder's shape and weights
    from slimpar.train.checkpoint import load_safetensors
    from slimpar.train.evaluate import evaluate
    from slimpar.train.strategies.base import Strategy

    data = build_data(cfg)
    model = build_model(cfg, data)
    model.load_state_dict(load_safetensors(weights), strict=True)
    results = evaluate(Strategy(model), data, cfg, rank=0, world=1)
    (run_dir / "eval.json").write_text(json.dumps(results, indent=2))
    for k, v in results.items():
        print(f"{k:>28s}  {v:.4f}")
    return results
