"""Elastic SDP on two "nodes" (``benchmarks.network.nodes``): ``torchrun --nnodes 1:2 --max-restarts 1`` in each of
two network namespaces; node 1 (its agent and workers) is SIGKILLed after a checkpoint and the run finishes on node 0.
In the second case node 0 starts alone and node 1 joins the running job before it is killed.

What must hold (docs/multinode.md, "Elastic runs"): the run re-forms with 2 workers instead of 4, resumes from the
newest checkpoint, keeps the global batch, trains every global sample position of every step exactly once
(``log.samples``), records the membership change in ``membership.json``, ``metrics.jsonl`` and ``summary.json``,
and from the change on is bitwise the run a plain resume with 2 local workers makes from the same checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from benchmarks.network.links import list_namespaces
from benchmarks.network.nodes import TwoNodes, run_elastic_two_nodes
from tests.helpers import TINY, losses, run_train, summary

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CAP_SYS_ADMIN)")

STEPS, BATCH, KILL_AFTER = 100, 8, 8
RUN = ["--parallel.mode", "sdp", "--train.steps", str(STEPS), "--train.batch_size", str(BATCH), "--checkpoint.every",
       "4", "--checkpoint.keep_last", "0", "--log.samples", "true", "--log.progress", "false",
       "--checkpoint.export", "false", "--data.ood", "none", "--parallel.timeout_s", "60"]


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _world_at(step: int, changes: list[dict], first: int) -> int:
    """The world size that trained ``step`` (1-based): a change at step k takes effect from step k + 1."""
    world = first
    for c in changes:
        if step > c["step"]:
            world = c["new_world"]
    return world


# leave: both nodes from the start, node 1 killed after checkpoint 8 (4 -> 2 workers);
# join-leave: node 0 alone, node 1 joins after checkpoint 4 (2 -> 4), then is killed (4 -> 2)
CASES = {"leave": (None, [(4, 2)]), "join-leave": (4, [(2, 4), (4, 2)])}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_elastic_sdp_run_loses_node_1_and_finishes_on_node_0(tmp_path, case):
    join_after, worlds = CASES[case]
    out = tmp_path / "elastic"
    with TwoNodes(prefix="spnel") as nodes:
        got = run_elastic_two_nodes(nodes, TINY, out, RUN, kill_after=KILL_AFTER, join_after=join_after,
                                    timeout_s=500)
    assert [n for n in list_namespaces() if n.startswith("spnel-")] == []
    changes = got["membership"]
    assert [(c["old_world"], c["new_world"]) for c in changes] == worlds, changes
    assert [c["restart"] for c in changes] == [0] * (len(worlds) - 1) + [1]  # a join is no failure
    k = changes[-1]["step"]
    assert KILL_AFTER <= k < STEPS and k % 4 == 0, got["elastic"]
    assert got["world_size"] == 2 and got["steps"] == STEPS and got["resumed_from_step"] == k
    records = _records(out)
    assert [r for r in records if "kind" in r] == [{"kind": "membership", **c} for c in changes]
    train = [r for r in records if "kind" not in r]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))  # every step logged once
    for r in train:  # each step trained on exactly its global batch, in equal contiguous shares of its world
        first, width = (r["step"] - 1) * BATCH, BATCH // _world_at(r["step"], changes, worlds[0][0])
        assert r["samples"] == [[a, a + width] for a in range(first, first + BATCH, width)], r
    seen = [p for r in train for a, b in r["samples"] for p in range(a, b)]
    assert sorted(seen) == list(range(STEPS * BATCH))  # no position twice, none skipped
    attempts = json.loads((out / "membership.json").read_text())["attempts"]
    assert [a["world"] for a in attempts] == [worlds[0][0], *(w for _, w in worlds)]
    assert len({a["job"] for a in attempts}) == 1  # one torchrun job throughout

    # the re-formed run is the run a plain resume at 2 workers makes from the same checkpoint, to the bit
    plain = tmp_path / "plain"
    (plain / "checkpoints").mkdir(parents=True)
    shutil.copytree(out / "checkpoints" / f"step_{k:06d}", plain / "checkpoints" / f"step_{k:06d}")
    shutil.copy(out / "config.toml", plain / "config.toml")
    run_train(plain, *RUN, "--parallel.workers", "2", timeout=300)
    assert losses(plain) == losses(out)[k:]
    assert summary(plain)["val_loss"] == got["val_loss"]
    assert summary(plain)["membership"] == []  # a plain start on the checkpoint's folder copy knows no earlier world
