"""``slimpar eval --run RUN --lm-eval TASKS``: lm-evaluation-harness on a run's Hugging Face export.

The run is exported (``slimpar export --hf``) to a temporary folder and evaluated with lm-eval's
``hf`` model on CPU in float32. ``TASKS`` is a comma list of slimpar's local tasks
(:mod:`slimpar.data.eval_tasks`; ``slimpar`` names all three) and/or lm-eval's own task names
(HellaSwag, PIQA, ARC, ...), which run when their datasets are already in the local Hugging Face
cache (the hub is never contacted: ``HF_DATASETS_OFFLINE=1``). Results go to ``RUN/lm_eval.json``.
lm-eval's, datasets' and transformers' progress bars are hidden unless ``--verbose`` asks for them.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from slimpar.commands.export_hf import export_hf
from slimpar.config import ConfigError, load_config
from slimpar.data.eval_tasks import TASKS, write_tasks

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


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """No progress bars from lm-eval, datasets or transformers inside the block; each is restored after.

    One ``--lm-eval slimpar`` draws some thirty bars: transformers' while loading the weights, datasets' per
    split, lm-eval's per task while building requests and per request batch. datasets and transformers have
    switches; lm-eval has none, so the ``tqdm`` its modules imported is swapped for a subclass that is
    always disabled (and ``tqdm.tqdm`` too, for the functions that import it when they run).
    """
    import datasets
    import lm_eval.api.model  # noqa: F401  (imported now, so that their tqdm is swapped below)
    import lm_eval.api.task  # noqa: F401
    import lm_eval.models.huggingface  # noqa: F401
    import tqdm as tqdm_lib
    from transformers.utils import logging as transformers_logging

    swapped = [(m, m.tqdm) for name, m in list(sys.modules.items())
               if (name.startswith("lm_eval") or m is tqdm_lib) and _is_tqdm_class(getattr(m, "tqdm", None))]
    for module, cls in swapped:
        module.tqdm = type(cls.__name__, (cls,), {"__init__": _disabled_init(cls)})
    # HF_DATASETS_DISABLE_PROGRESS_BARS set by the user has priority (datasets warns if overruled)
    datasets_on = "HF_DATASETS_DISABLE_PROGRESS_BARS" not in os.environ and not datasets.are_progress_bars_disabled()
    transformers_on = transformers_logging.is_progress_bar_enabled()
    if datasets_on:
        datasets.disable_progress_bars()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        for module, cls in swapped:
            module.tqdm = cls
        if datasets_on:
            datasets.enable_progress_bars()
        if transformers_on:
            transformers_logging.enable_progress_bar()


def _is_tqdm_class(obj: object) -> bool:
    import tqdm as tqdm_lib

    return isinstance(obj, type) and issubclass(obj, tqdm_lib.tqdm)


def _disabled_init(cls: type):
    def __init__(self, *args, **kwargs):
        cls.__init__(self, *args, **{**kwargs, "disable": True})
    return __init__


def run_lm_eval(run_dir: Path, tasks: str, limit: int | None = None, batch_size: int = 8,
                verbose: bool = False) -> dict:
    """Evaluate the run's export on ``tasks``; returns {task: {metric: value}} and writes RUN/lm_eval.json.
    ``verbose`` shows the progress bars of lm-eval and the Hugging Face libraries (hidden by default)."""
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
    quiet = contextlib.nullcontext() if verbose else quiet_progress()
    with quiet, tempfile.TemporaryDirectory(prefix="slimpar-lm-eval-") as tmp:
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


def lm_eval_command(run: str, tasks: str, limit: int | None, verbose: bool = False) -> int:
    out = run_lm_eval(Path(run), tasks, limit, verbose=verbose)
    for task, metrics in out["tasks"].items():
        shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if not k.endswith("_stderr"))
        print(f"{task:>32s}  {shown}")
    own = out["slimpar_eval"]
    if own:
        print(f"{'slimpar eval (same run)':>32s}  " + "  ".join(f"{k} {v:.4f}" for k, v in own.items()))
    print(f"wrote {Path(run) / 'lm_eval.json'}")
    return 0
