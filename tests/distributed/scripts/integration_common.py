"""What the integration scripts share: the ``slimpar train`` run they are compared with (its config and batches,
as Hugging Face rows), a list dataset and a state-dict difference."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils.data import Dataset

from slimpar.train.build import build_data
from tests.helpers import TINY
from tests.sdp_reference import config_for

WORLD = 2


def run_config(overrides_file: str):
    """The resolved config of ``slimpar train --config configs/llama_tiny.toml`` with the file's overrides."""
    return config_for(TINY, json.loads(Path(overrides_file).read_text()))


def shares(cfg) -> dict[tuple[int, int, int], torch.Tensor]:
    """(step, micro-batch, rank) -> the run's token rows, (b, T + 1): x with y's last token appended, so a HF
    causal LM's T shifted predictions are slimpar's T targets. Rank r's micro-batch m of a step is the run's
    share r·M + m of that step's global batch."""
    t, data, out = cfg.train, build_data(cfg), {}
    for step in range(t.steps):
        for micro in range(t.grad_accum):
            for r in range(WORLD):
                x, y = data.train_batch(step, r * t.grad_accum + micro, WORLD * t.grad_accum, t.batch_size,
                                        cfg.data.seq_len)
                out[step, micro, r] = torch.cat([x, y[:, -1:]], 1)
    return out


def row(ids: torch.Tensor) -> dict:
    return {"input_ids": ids, "labels": ids}


class Rows(Dataset):
    def __init__(self, rows: list[dict]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
