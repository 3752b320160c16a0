"""``slimpar eval --run RUN --lm-eval TASKS``: lm-evaluation-harness on a run's Hugging Face export.

The run is exported (``slimpar export --hf``) to a temporary folder and evaluated with lm-eval's
``hf`` model on CPU in float32. ``TASKS`` is a comma list of slimpar's local tasks
(:mod:`slimpar.data.eval_tasks`; ``slimpar`` names all three) and/or lm-eval's own task names
(HellaSwag, PIQA, ARC, ...), which run when their datasets are already in the local Hugging Face
cache (the hub is never contacted: ``HF_DATASETS_OFFLINE=1``). Results go to ``RUN/lm_eval.json``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from slimpar.config import ConfigError, load_config
from slimpar.data.eval_tasks import TASKS, write_tasks
from slimpar.train.export_hf import export_hf

LOCAL = tuple(TASKS)
SHORT = {"slimpar": LOCAL, **{n.removeprefix("slimpar_"): (n,) for n in LOCAL}}


def _task_names(spec: str) -> list[str]:
    names: list[str] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        names += SHORT.get(item, (item,))
    if not names:
        raise ConfigError("--lm-eval needs task names, e.g. --lm-eval slimpar (all local tasks) or "
                          f"--lm-eval {','.join(LOCAL)},hellaswag")
    return list(dict.fromkeys(names))


def _metrics(results: dict, task: str) -> dict:
    raw = results["results"].get(task, {})
    return {k.split(",")[0]: v for k, v in raw.items() if "," in k and isinstance(v, (int, float))}


def run_lm_eval(run_dir: Path, tasks: str, limit: int | None = None, batch_size: int = 8) -> dict:
    """Evaluate the run's export on ``tasks``; returns {task: {metric: value}} and writes RUN/lm_eval.json."""
    names = _task_names(tasks)
    if not (run_dir / "config.toml").is_file():
        raise ConfigError(f"{run_dir / 'config.toml'} not found: --run must be a `slimpar train` folder")
    cfg = load_config(run_dir / "config.toml")
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ConfigError("lm-eval is not installed: pip install 'slimpar[eval]' (or pip install lm-eval)") from None
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="slimpar-lm-eval-") as tmp:
        hf, task_dir = Path(tmp) / "hf", Path(tmp) / "tasks"
        export_hf(run_dir, hf)
        write_tasks(task_dir, cfg.data.heldout_works, cfg.data.cache_dir or None)
        results = lm_eval.simple_evaluate(
            model="hf", model_args={"pretrained": str(hf), "dtype": "float32", "device": "cpu"}, tasks=names,
            batch_size=batch_size, limit=limit, task_manager=TaskManager(include_path=str(task_dir)),
            log_samples=False)
    out = {"tasks": {t: _metrics(results, t) for t in names}, "limit": limit,
           "lm_eval_version": getattr(lm_eval, "__version__", None), "slimpar_eval": _own_eval(run_dir)}
    (run_dir / "lm_eval.json").write_text(json.dumps(out, indent=2) + "\n")
    return out


def _own_eval(run_dir: Path) -> dict:
    """slimpar's own validation numbers of the same run, for the comparison table."""
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return {}
    s = json.loads(summary.read_text())
    return {k: v for k, v in s.items() if k.startswith("val_") and isinstance(v, (int, float))}


def lm_eval_command(run: str, tasks: str, limit: int | None) -> int:
    out = run_lm_eval(Path(run), tasks, limit)
    for task, metrics in out["tasks"].items():
        shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if not k.endswith("_stderr"))
        print(f"{task:>32s}  {shown}")
    own = out["slimpar_eval"]
    if own:
        print(f"{'slimpar eval (same run)':>32s}  " + "  ".join(f"{k} {v:.4f}" for k, v in own.items()))
    print(f"wrote {Path(run) / 'lm_eval.json'}")
    return 0
