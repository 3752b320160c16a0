"""Each candidate's peak memory per worker: ``slimpar plan --memory``'s fake-tensor step, in a pool, cached.

For every candidate the workers whose memory can be the largest are predicted (slimpar.train.memory.predict):
rank 0 of DDP and FSDP2; SDP's worker holding the most (the first shard of its replica in the 2-D layout); a
pipeline's first stage (the embedding, the most blocks of an uneven split, and under 1F1B the most
microbatches in flight) and its last (the head and the logits); a middle stage holds no more than the first.
The step measured is step 1 (``log.measure_step``): the optimizer
state exists from step 0 on, so its peak equals a later step's.

Predictions run in ``jobs`` spawned processes (each a fake process group of its own) and are cached under
``$SLIMPAR_CACHE/plan-fit`` (default ``~/.cache/slimpar``), keyed by the resolved config, the ranks, the torch
version and a hash of slimpar's source, so a changed slimpar never reads an old answer.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

from slimpar.config import Config, to_dict


def ranks_to_predict(cfg: Config) -> list[int]:
    """The workers whose memory can differ (module docstring)."""
    from slimpar.train.run_plan import run_plan

    run = run_plan(cfg)
    return run.mode.heaviest_ranks(run)


def _source_hash() -> str:
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("SLIMPAR_CACHE") or str(Path.home() / ".cache" / "slimpar")
    return Path(base) / "plan-fit"


def _key(cfg: Config, ranks: list[int], source: str) -> str:
    import torch

    text = json.dumps([to_dict(cfg), ranks, torch.__version__, source], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _predict(cfg: Config, ranks: list[int]) -> list[dict]:
    import torch

    from slimpar.train.memory.predict import predict_memory

    torch.set_num_threads(1)
    return predict_memory(replace(cfg, log=replace(cfg.log, measure_step=1)), ranks)


class Predictor:
    """A pool of ``jobs`` spawned processes that predict configs' memory, with the cache in front of it (a
    context manager: the pool starts at the first miss and ends with the ``with``)."""

    def __init__(self, jobs: int = 2) -> None:
        self.jobs, self.source, self.folder = max(1, jobs), _source_hash(), cache_dir()
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Predictor:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def predict(self, cfgs: dict[str, Config], on_done: Callable[[str], None] | None = None
                ) -> dict[str, list[dict] | str]:
        """name -> the predicted ``mem`` records of its ranks (or an error's text), for every config in ``cfgs``."""
        out, todo = {}, {}
        for name, cfg in cfgs.items():
            ranks = ranks_to_predict(cfg)
            path = self.folder / f"{_key(cfg, ranks, self.source)}.json"
            if path.is_file():
                out[name] = json.loads(path.read_text())
                if on_done:
                    on_done(name)
            else:
                todo[name] = (cfg, ranks, path)
        if not todo:
            return out
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.pool is None:
            self.pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"))
        futures = {self.pool.submit(_predict, cfg, ranks): name for name, (cfg, ranks, _) in todo.items()}
        for fut in as_completed(futures):
            name = futures[fut]
            try:
                rows = fut.result()
            except Exception as e:  # a candidate the step cannot build: reported in its row, the rest go on
                out[name] = f"memory prediction failed: {type(e).__name__}: {e}"
            else:
                out[name] = rows
                todo[name][2].write_text(json.dumps(rows))
            if on_done:
                on_done(name)
        return out
