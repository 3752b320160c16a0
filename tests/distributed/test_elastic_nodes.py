"""Elastic SDP on two "nodes" (``slimpar.bench.nodes``): ``torchrun --nnodes 1:2 --max-restarts 1`` in each of two
network namespaces; node 1 (its agent and workers) is SIGKILLed after a checkpoint and the run finishes on node 0.

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

from slimpar.bench.links import list_namespaces
from slimpar.bench.nodes import TwoNodes, run_elastic_two_nodes
from tests.helpers import TINY, losses, run_train, summary

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CAP_SYS_ADMIN)")

STEPS, BATCH, KILL_AFTER = 40, 8, 8
RUN = ["--parallel.mode", "sdp", "--train.steps", str(STEPS), "--train.batch_size", str(BATCH), "--checkpoint.every",
       "4", "--checkpoint.keep_last", "0", "--log.samples", "true", "--log.progress", "false",
       "--checkpoint.export", "false", "--data.ood", "none", "--parallel.timeout_s", "60"]


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_elastic_sdp_run_loses_node_1_and_finishes_on_node_0(tmp_path):
    out = tmp_path / "elastic"
    with TwoNodes(prefix="spnel") as nodes:
        got = run_elastic_two_nodes(nodes, TINY, out, RUN, kill_after=KILL_AFTER, timeout_s=500)
    assert [n for n in list_namespaces() if n.startswith("spnel-")] == []
    (change,) = got["membership"]
    k = change["step"]
    assert (change["old_world"], change["new_world"], change["restart"]) == (4, 2, 1)
    assert KILL_AFTER <= k < STEPS and k % 4 == 0, got["elastic"]
    assert got["world_size"] == 2 and got["steps"] == STEPS and got["resumed_from_step"] == k
    records = _records(out)
    assert [r for r in records if "kind" in r] == [{"kind": "membership", **change}]
    train = [r for r in records if "kind" not in r]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))  # every step logged once
    for r in train:  # each step trained on exactly its global batch: 4 shares of 2 before the change, 2 of 4 after
        first = (r["step"] - 1) * BATCH
        width = BATCH // (4 if r["step"] <= k else 2)
        assert r["samples"] == [[a, a + width] for a in range(first, first + BATCH, width)], r
    seen = [p for r in train for a, b in r["samples"] for p in range(a, b)]
    assert sorted(seen) == list(range(STEPS * BATCH))  # no position twice, none skipped
    attempts = json.loads((out / "membership.json").read_text())["attempts"]
    assert [(a["world"], a["restart"]) for a in attempts] == [(4, 0), (2, 1)]

    # the re-formed run is the run a plain resume at 2 workers makes from the same checkpoint, to the bit
    plain = tmp_path / "plain"
    (plain / "checkpoints").mkdir(parents=True)
    shutil.copytree(out / "checkpoints" / f"step_{k:06d}", plain / "checkpoints" / f"step_{k:06d}")
    shutil.copy(out / "config.toml", plain / "config.toml")
    run_train(plain, *RUN, "--parallel.workers", "2", timeout=300)
    assert losses(plain) == losses(out)[k:]
    assert summary(plain)["val_loss"] == got["val_loss"]
    assert summary(plain)["membership"] == []  # a plain start on the checkpoint's folder copy knows no earlier world
