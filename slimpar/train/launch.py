"""Start a training job: in this process, under an existing torchrun group, or as local CPU workers
through torch's own elastic launcher (the machinery behind torchrun).

Resuming is the default: a run folder that holds a complete checkpoint continues from it
(``checkpoint.resume``, see :mod:`slimpar.train.trainer`); ``--fresh`` deletes the old run's outputs
(:data:`FRESH_DELETES`) and starts over. With ``parallel.max_restarts`` N (``slimpar train
--max-restarts N``) the elastic agent restarts all workers after a failure, up to N times, and each
restart resumes from the newest complete checkpoint by itself.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from pathlib import Path

from slimpar.config import Config, to_dict, to_toml
from slimpar.train.elastic import MEMBERSHIP, restart_count
from slimpar.train.init_from import INIT_FROM_RECORD, record_init_from
from slimpar.train.worker import worker_main

# what --fresh removes from the run folder (only these; config.toml is rewritten, tokenizer files are kept)
FRESH_DELETES = ("checkpoints", "metrics.jsonl", "summary.json", "model.safetensors", "manifest.json", "eval.json",
                 INIT_FROM_RECORD, "tensorboard", "mlruns", MEMBERSHIP)

def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def run_name(config_name: str, cfg: Config | None = None) -> str:
    """What a run folder is named after: the config (not ``default``, which says nothing) and, for the
    user's own data (``data.corpus = "path"``), the data file or folder: ``mytext`` for the default config
    on ``mytext.txt``, ``llama_small-mytext`` for ``--config llama_small``."""
    parts = [Path(config_name).stem]
    if cfg is not None and cfg.data.kind == "text" and cfg.data.corpus == "path" and cfg.data.path:
        data = Path(cfg.data.path).expanduser().resolve()
        stem = data.stem if data.is_file() else data.name
        parts = [p for p in parts if p != "default"] + [re.sub(r"[^A-Za-z0-9._-]+", "_", stem) or "data"]
    return "-".join(parts)


def default_run_folder(config_name: str, cfg: Config | None = None) -> Path:
    """``runs/<name>`` (:func:`run_name`), the folder of a run started without ``--out``.

    No time stamp: the same command run again finds the same folder and resumes the run from its newest
    checkpoint (its settings checked against the folder's ``config.toml``, :mod:`slimpar.train.rerun`);
    ``--fresh`` starts over there. Under torchrun every rank computes the same name, so they share one folder.
    """
    return Path("runs") / run_name(config_name, cfg)


def prepare_out_dir(cfg: Config, out_dir: Path) -> None:
    """Create the run folder and write the resolved config (rank 0 / the launching process only).

    A fresh start (``checkpoint.resume = false``: ``slimpar train --fresh``) deletes :data:`FRESH_DELETES`
    first, so that no old checkpoint outlives it, but never in a restarted worker: a job restarted by the
    elastic agent continues the run it started. ``metrics.jsonl`` is not touched otherwise: the trainer
    truncates it to the step it resumes from (0 without a checkpoint). With ``model.init_from``, the first
    start records the folder's sha256 (:mod:`slimpar.train.init_from`), which later starts check.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if not cfg.checkpoint.resume and restart_count() == 0:
        for name in FRESH_DELETES:
            path = out_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    (out_dir / "config.toml").write_text(to_toml(cfg))
    record_init_from(cfg, out_dir)  # at the first start only: the sha256 of the files the run starts from


def launch(cfg: Config, out_dir: Path) -> None:
    """Run ``cfg`` with ``parallel.workers`` processes and write outputs to ``out_dir``."""
    if under_torchrun():
        if int(os.environ.get("RANK", "0")) == 0:
            prepare_out_dir(cfg, out_dir)
        worker_main(to_dict(cfg), str(out_dir))
        return
    prepare_out_dir(cfg, out_dir)
    if cfg.parallel.mode == "single" or (cfg.parallel.mode == "pipeline" and cfg.pipeline.virtual) or (
            cfg.parallel.mode == "sdp" and cfg.sdp.virtual):
        worker_main(to_dict(cfg), str(out_dir))
        return
    _elastic(cfg, out_dir)


def _elastic(cfg: Config, out_dir: Path) -> None:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    lc = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=cfg.parallel.workers,
        run_id=f"slimpar-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=cfg.parallel.max_restarts,  # each restart resumes from the newest checkpoint (worker.py)
        monitor_interval=0.1,
        start_method="spawn",
    )
    # workers share the machine's cores instead of each starting a full thread pool
    # glibc returns freed blocks to the OS only above this size: RSS peaks then track live tensors (env.md)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.parallel.workers)))
    quiet = _QuietInterrupt()
    loggers = [logging.getLogger(f"torch.distributed.elastic.{m}.api") for m in ("agent.server", "multiprocessing")]
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        elastic_launch(lc, worker_main)(to_dict(cfg), str(out_dir))
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


class _QuietInterrupt(logging.Filter):
    """Drops the elastic agent's log lines about Ctrl-C ("Received 2 death signal", "Closing process N via
    signal SIGINT"): the user pressed it, and slimpar's one line says where the run is and how to resume it."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return "Received 2 death signal" not in msg and "via signal SIGINT" not in msg
