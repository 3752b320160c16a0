"""SDP evaluation's memory, by exact accounting (slimpar.parallel.comm.StepInstrument: the bytes every op of
``strategy.evaluate`` allocates, at their peak; FakeTensorMode on the CPU, as ``slimpar plan --memory`` measures,
tests/standin_device.py). The full model is gathered to worker 0 alone, so the other workers hold nothing beyond
their subnetworks; before, every rank gathered it. docs/gpu.md has the table for the 134m LLaMA
(``python -m tests.unit.test_sdp_eval_memory``)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from tests.standin_device import standin_accelerator
from tests.standin_run import TINY, standin_trainer


def eval_peaks(overrides: list[str]) -> list[dict]:
    """Per rank: the peak bytes the full model's gather allocates, to every rank (as 1586a30 did) and to worker 0
    only, the peak of the whole evaluation (gather to worker 0, forward of every batch there), and the parameter
    bytes this rank holds and the full model has."""
    from slimpar.parallel.comm import StepInstrument
    from slimpar.train.validate.checks import load_run_config

    cfg = load_run_config(str(TINY), ["--parallel.mode", "sdp", "--sdp.keep", "0.5", "--eval.batches", "1",
                                      "--data.ood", "none", *overrides], training=False)
    out = []
    for rank in range(cfg.parallel.workers):
        cpu = torch.device("cpu")
        with tempfile.TemporaryDirectory() as tmp, standin_accelerator(rank, cfg.parallel.workers, cpu) as device:
            s = standin_trainer(cfg, rank, device, Path(tmp)).strategy
            peaks = {}
            for name, dst in (("gather_every_rank", None), ("gather_to_worker_0", 0)):
                with StepInstrument() as inst:
                    s.wrapper.gather_full_model(**({} if dst is None else {"dst": dst}))
                peaks[name] = inst.peak
            with StepInstrument() as inst:
                s.evaluate(_data(cfg), cfg)
            full = sum(p.numel() * p.element_size() for p in s.wrapper.skeleton[0].parameters())
            held = sum(p.numel() * p.element_size() for p in s.wrapper.module.parameters())
        out.append({"rank": rank, **peaks, "eval_peak": inst.peak, "full_params": full, "held_params": held})
    return out


def _data(cfg):
    from tests.standin_run import StandInText

    return StandInText(cfg.model.vocab_size or cfg.data.vocab_size)


def test_only_worker_0_holds_the_full_model_at_evaluation():
    ranks = eval_peaks(["--parallel.workers", "2"])
    full = ranks[0]["full_params"]
    for r in ranks:
        assert r["gather_every_rank"] >= full  # 1586a30: a whole copy on every rank
    assert ranks[0]["gather_to_worker_0"] >= full and ranks[0]["eval_peak"] > full  # and its forward
    assert ranks[1]["gather_to_worker_0"] < 0.01 * full and ranks[1]["eval_peak"] < 0.01 * full  # it only sends


if __name__ == "__main__":  # the table of docs/gpu.md
    args = sys.argv[1:] or ["--model.size", "134m", "--model.vocab_size", "32000", "--data.seq_len", "1024",
                            "--eval.batch_size", "8", "--parallel.workers", "4"]
    print("| rank | parameters held | gather to every rank (1586a30) | gather to worker 0 | evaluation |")
    for r in eval_peaks(args):
        mib = {k: f"{v / 2**20:,.0f} MiB" for k, v in r.items() if k != "rank"}
        print(f"| {r['rank']} | {mib['held_params']} of {mib['full_params']} | {mib['gather_every_rank']} | "
              f"{mib['gather_to_worker_0']} | {mib['eval_peak']} |")
