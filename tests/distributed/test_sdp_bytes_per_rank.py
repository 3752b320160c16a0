"""Bytes per rank, sent and received, through ``slimpar train`` with 4 gloo workers on the tiny LLaMA.

For DDP and Bb-SDP (backward masking) at keep 0.5 and 3/8, step 1 runs under the instrument (every step
refreshes). Per rank, the modelled bytes sent and received equal a hand count from the plan: ring
all-reduces of every held gradient with k_c > 1 and of the shared gradients plus the 8-byte clipping norm
over all 4 workers, 2 (k - 1) / k of the bytes each way; each refresh broadcast as gloo's binomial tree
over its root (``sdp.roots.refresh_roots``) and the non-holders. No rank sends more than a DDP rank, the
bytes the processes wrote to sockets match the model to within gloo's headers, and summary.json carries
the mean and max over ranks.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from slimpar.parallel.comm import ring_allreduce
from slimpar.sdp.roots import refresh_roots
from slimpar.train.build import build_model
from slimpar.train.strategies.sdp_plan import plan_from_config
from tests.helpers import TINY, LazyRuns, run_train, summary
from tests.sdp_reference import component_numel, config_for

COMMON = ["--parallel.workers", "4", "--train.steps", "2", "--log.measure_step", "1", "--eval.batches", "1",
          "--data.ood", "none", "--checkpoint.export", "false", "--checkpoint.final", "false"]
BB = ["--parallel.mode", "sdp", "--sdp.level", "block", "--sdp.regime", "backward"]
RUNS = {"ddp": ["--parallel.mode", "ddp"], "bb_0.5": [*BB, "--sdp.keep", "0.5"],
        "bb_3/8": [*BB, "--sdp.keep", "0.375"]}
TREE = {2: {0: 1}, 3: {0: 2}, 4: {0: 2, 1: 1}}  # gloo's binomial broadcast: copies sent by virtual rank


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bytes_per_rank")

    def make(name: str) -> dict:
        run_train(root / name.replace("/", "_"), *COMMON, *RUNS[name])
        return summary(root / name.replace("/", "_"))

    return LazyRuns(make)


BB_CASES = ["bb_0.5", pytest.param("bb_3/8", marks=pytest.mark.slow)]  # 3/8 adds a run: slow


def _hand_count(name: str) -> tuple[list[int], list[int], object]:
    """Per rank (sent, received) from the plan's mask and the model's shapes."""
    cfg = config_for(TINY, [*COMMON, *RUNS[name]])
    model = build_model(cfg)
    plan = plan_from_config(cfg, model)
    n = plan.world_size
    numel = [component_numel(model, comp) for comp in plan.components]
    shared = sum(p.numel() for p in model.parameters()) - sum(numel)
    sent, recv = [Fraction(0)] * n, [Fraction(0)] * n
    for r in range(n):
        per_set: dict[tuple[int, ...], int] = {}
        for c in range(len(numel)):
            if plan.mask[r, c] and len(plan.holders(c)) > 1:
                per_set[plan.holders(c)] = per_set.get(plan.holders(c), 0) + 4 * numel[c]
        grads = sum(ring_allreduce(b, len(hs)) for hs, b in per_set.items()) + ring_allreduce(4 * shared + 8, n)
        sent[r] += grads
        recv[r] += grads
    roots = refresh_roots(plan)
    for c, root in roots.items():
        members = sorted({root} | set(range(n)) - set(plan.holders(c)))
        for i, w in enumerate(members):
            vrank = (i - members.index(root)) % len(members)
            sent[w] += TREE[len(members)].get(vrank, 0) * 4 * numel[c]
            recv[w] += 0 if w == root else 4 * numel[c]
    return [round(s) for s in sent], [round(x) for x in recv], plan


@pytest.mark.parametrize("name", BB_CASES)
def test_sent_and_received_equal_hand_count(runs, name):
    s = runs[name]
    sent, recv, plan = _hand_count(name)
    assert plan.mask.sum(0).min() < 4  # some blocks are stale on some workers: the step refreshes
    assert [r["comm_bytes_sent"] for r in s["per_rank"]] == sent
    assert [r["comm_bytes_recv"] for r in s["per_rank"]] == recv
    assert s["comm_bytes_sent_per_step_max"] == max(sent) and s["comm_bytes_recv_per_step_max"] == max(recv)
    assert s["comm_bytes_sent_per_step_mean"] == pytest.approx(sum(sent) / 4)
    assert s["comm_bytes_recv_per_step_mean"] == pytest.approx(sum(recv) / 4)
    assert s["comm_bytes_per_step"] == pytest.approx(sum(r["comm_bytes"] for r in s["per_rank"]) / 4)


@pytest.mark.parametrize("name", BB_CASES)
def test_no_rank_sends_more_than_ddp(runs, name):
    ddp = [r["comm_bytes_sent"] for r in runs["ddp"]["per_rank"]]
    ddp_grads = ring_allreduce(runs["ddp"]["per_rank"][1]["comm_by_op"]["allreduce_@0x4"], 4)
    assert min(ddp) >= ddp_grads  # DDP's ranks also broadcast its buffers
    assert runs[name]["comm_bytes_sent_per_step_max"] <= min(ddp)


def test_even_plan_spreads_the_refresh(runs):
    """Keep 0.5: every block has 2 holders, so the roots spread to one broadcast per rank."""
    per_rank = runs["bb_0.5"]["per_rank"]
    assert len({r["comm_bytes_sent"] for r in per_rank}) == 1
    assert all(sum(1 for k in r["comm_sent_by_op"] if k.startswith("broadcast_")) == 1 for r in per_rank)


@pytest.mark.parametrize("name", ["ddp", *BB_CASES])
def test_wire_bytes_match_the_model(runs, name):
    """What each process wrote to its sockets (/proc/self/io) is the modelled bytes sent plus gloo's
    message headers (a few KiB), and summary.json has the max next to the mean."""
    s = runs[name]
    for r in s["per_rank"]:
        assert 0 <= r["wire_bytes"] - r["comm_bytes_sent"] <= 0.01 * r["comm_bytes_sent"] + 16384, r
    wire = [r["wire_bytes"] for r in s["per_rank"]]
    assert s["wire_bytes_per_step_max"] == max(wire)
    assert s["wire_bytes_per_step"] == pytest.approx(sum(wire) / 4)
