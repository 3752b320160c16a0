"""How low can batched virtual B-SDP 0.5's step go against DDP's? (issue 20, item 2: the target is <= 0.6)

The model and batch of ``slimpar bench sdp --rows virtual,batch``: LLaMA "mini" with 8 blocks and a 1024-token
vocabulary, 4 simulated workers of 2 x 64 tokens each, one thread. It reports

- the exact matrix FLOPs of one forward and backward (torch's FlopCounterMode): DDP on the concatenated batch,
  and the batched pass with every block on its holders' rows only (tests/unit/test_sdp_batched.py checks the
  identity bare + blocks / 2);
- the time of each part of a step, DDP and batched alternating in rounds: forward + backward, and the rest
  (holder averaging, clipping and AdamW over every parameter, which SDP does not shrink);
- the floor: the step ratio if forward + backward fell to exactly the FLOP ratio and the rest stayed.

    python scripts/sdp_step_floor.py --out docs/results/batch_size/step_floor.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from slimpar.models.llama import Llama, LlamaConfig
from slimpar.sdp.batched import BatchedSDP
from slimpar.sdp.planner import plan_model

WORKERS, ROWS, T, VOCAB = 4, 2, 64, 1024


def _loss(logits: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten())


class Step:
    """One training step of DDP (``keep`` None: the plain model on the concatenated batch) or batched B-SDP."""

    def __init__(self, xs: list[torch.Tensor], keep: float | None):
        torch.manual_seed(0)
        self.model = Llama(LlamaConfig.named("mini", vocab_size=VOCAB, n_layers=8))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.xs = xs
        self.b = None if keep is None else BatchedSDP(self.model, plan_model(self.model, WORKERS, keep, level="block"))

    def forward_backward(self) -> None:
        if self.b is None:
            seq = torch.cat(self.xs)
            _loss(self.model(seq[:, :-1]), seq).backward()
            return
        with self.b.rows([len(x) for x in self.xs]):
            logits = self.model(torch.cat(self.xs)[:, :-1])
            sum(_loss(lg, s) for lg, s in zip(logits.split(self.b.counts), self.xs, strict=True)).backward()

    def rest(self) -> None:
        if self.b is None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        else:
            self.b.average_grads()
            self.b.clip_grad_norm_(1.0)
        self.opt.step()
        self.opt.zero_grad()

    def timed(self) -> tuple[float, float]:
        t0 = time.perf_counter()
        self.forward_backward()
        t1 = time.perf_counter()
        self.rest()
        return t1 - t0, time.perf_counter() - t1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per row and round (after 5 warm-up)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randint(0, VOCAB, (ROWS, T + 1), generator=g) for _ in range(WORKERS)]
    steps = {"DDP": Step(xs, None), "batched B-SDP 0.5": Step(xs, 0.5)}
    flops = {}
    for name, step in steps.items():
        with FlopCounterMode(display=False) as count:
            step.forward_backward()
        step.opt.zero_grad()
        flops[name] = count.get_total_flops()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for r in range(args.rounds):
        for name in (list(steps) if r % 2 == 0 else list(steps)[::-1]):  # alternate which goes first
            for i in range(5 + args.steps):
                t = steps[name].timed()
                if i >= 5:
                    times[name].append(t)
    med = {name: {"forward_backward_s": statistics.median(a for a, _ in ts),
                  "rest_s": statistics.median(b for _, b in ts)} for name, ts in times.items()}
    ddp, bat = med["DDP"], med["batched B-SDP 0.5"]
    ddp_step = ddp["forward_backward_s"] + ddp["rest_s"]
    flop_ratio = flops["batched B-SDP 0.5"] / flops["DDP"]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    data = {"commit": commit, "torch": torch.__version__, "load_1m": os.getloadavg()[0],
            "flops": flops, "flop_ratio": flop_ratio, "median": med,
            "step_ratio": (bat["forward_backward_s"] + bat["rest_s"]) / ddp_step,
            "forward_backward_ratio": bat["forward_backward_s"] / ddp["forward_backward_s"],
            "rest_share_of_ddp_step": ddp["rest_s"] / ddp_step,
            "floor": (flop_ratio * ddp["forward_backward_s"] + bat["rest_s"]) / ddp_step}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
