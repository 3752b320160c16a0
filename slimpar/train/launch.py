"""Start a training job: in this process, under an existing torchrun group, or as local CPU workers
through torch's own elastic launcher (the machinery behind torchrun).

Resuming is the default: a run folder that holds a complete checkpoint continues from it
(``checkpoint.resume``, see :mod:`slimpar.train.trainer`); ``--fresh`` deletes the old run's outputs
(:data:`FRESH_DELETES`) and starts over. With ``parallel.max_restarts`` N (``slimpar train
--max-restarts N``) the elastic agent restarts all workers after a failure, up to N times, and each
restart resumes from the newest complete checkpoint by itself.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from datetime import timedelta
from pathlib import Path

from slimpar.config import Config, ConfigError, to_dict, to_toml
from slimpar.train.init_from import INIT_FROM_RECORD, record_init_from
from slimpar.train.worker import restart_count, worker_main

# what --fresh removes from the run folder (only these; config.toml is rewritten, tokenizer files are kept)
FRESH_DELETES = ("checkpoints", "metrics.jsonl", "summary.json", "model.safetensors", "manifest.json", "eval.json",
                 INIT_FROM_RECORD, "tensorboard", "mlruns")

RUN_FOLDER_KEY = "slimpar/run_folder"


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
    """``runs/<name>-<time>`` (:func:`run_name`), the folder of a run started without ``--out``, the same on every rank.

    Outside torchrun the launching process chooses it. Under torchrun every rank runs this, and the
    ranks' clocks (a 1.5 s start skew is common) would give different names, scattering checkpoint
    shards over several folders. So every rank proposes its own name on the elastic agent's TCPStore
    (``MASTER_ADDR:MASTER_PORT``) with ``compare_set``: the first proposal wins and every rank reads it.
    The store is used, not a ``broadcast_object_list`` after ``init_process_group``, because the
    folder is needed before the process group exists (rank 0 writes ``config.toml`` first), and
    because the agent's store outlives worker restarts: a job restarted by ``torchrun --max-restarts``
    finds the same folder and resumes from its checkpoint. ``TORCHELASTIC_RUN_ID`` is not used: it is
    ``none`` for every job started without ``--rdzv-id``/``--standalone``, so unrelated jobs would share
    (and resume) one folder. Without the agent's store (another launcher) there is no safe choice:
    ``--out`` is then required.
    """
    name = Path(f"runs/{run_name(config_name, cfg)}-{time.strftime('%Y%m%d-%H%M%S')}")
    if not under_torchrun():
        return name
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in os.environ:
        raise ConfigError("under this launcher every rank would choose its own run folder; pass --out DIR "
                          "(the same on every rank)")
    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timedelta(seconds=60))
    return Path(store.compare_set(RUN_FOLDER_KEY, "", str(name)).decode())


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
    elastic_launch(lc, worker_main)(to_dict(cfg), str(out_dir))
