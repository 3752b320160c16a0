"""Start a training job: in this process, under an existing torchrun group, or as local CPU workers
through torch's own elastic launcher (the machinery behind torchrun)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from slimpar.config import Config, to_dict, to_toml
from slimpar.train.worker import worker_main


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def prepare_out_dir(cfg: Config, out_dir: Path, resume: bool) -> None:
    """Create the run folder and write the resolved config (rank 0 / the launching process only)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if not resume and (out_dir / "metrics.jsonl").exists():
        (out_dir / "metrics.jsonl").unlink()
    (out_dir / "config.toml").write_text(to_toml(cfg))


def launch(cfg: Config, out_dir: Path) -> None:
    """Run ``cfg`` with ``parallel.workers`` processes and write outputs to ``out_dir``."""
    if under_torchrun():
        if int(os.environ.get("RANK", "0")) == 0:
            prepare_out_dir(cfg, out_dir, cfg.checkpoint.resume)
        worker_main(to_dict(cfg), str(out_dir))
        return
    prepare_out_dir(cfg, out_dir, cfg.checkpoint.resume)
    if cfg.parallel.mode == "single" or (cfg.parallel.mode == "pipeline" and cfg.pipeline.virtual):
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
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    # workers share the machine's cores instead of each starting a full thread pool
    # glibc returns freed blocks to the OS only above this size: RSS peaks then track live tensors (env.md)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.parallel.workers)))
    elastic_launch(lc, worker_main)(to_dict(cfg), str(out_dir))
