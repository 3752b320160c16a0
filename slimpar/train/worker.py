"""The entry point of each worker process: join or create the process group, train, clean up."""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from slimpar.config import from_dict
from slimpar.train.context import init_context
from slimpar.train.trainer import Trainer


def worker_main(cfg_dict: dict, out_dir: str) -> None:
    """Run one worker of a training job (called by the launcher in every process)."""
    cfg = from_dict(cfg_dict)
    ctx = init_context(cfg, Path(out_dir))
    try:
        Trainer(cfg, ctx).run()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
