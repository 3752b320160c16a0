"""Aten ops per step (the instrumented step's count, summary.json ``per_rank[0].aten_ops``) of a virtual pipeline,
against one process training the same model (4 stages, 4 microbatches, the same global batch): the rows of
``slimpar bench ops`` (benchmarks/ops.py; docs/results/ops), at batch 4 x 64, which does not change the count.

Budgets: one pass through the 4 stages at most 1.15x the single process's ops (the microbatched schedule ran
every stage's ops once per microbatch: 8,691 against 2,101 at 119f13a). MAPL 4x at most 1.05x the uncompressed
pipeline's on the 134m model (12 blocks, 3 a stage: 3,199 against 3,052), and at most 1.07x on llama_small (2 blocks
a stage: 2,383 against 2,236; 2,427 against 2,239 before D's Polar Express took the table's 7 rows and the codec,
SPEL and clip lost their repeated transposes, stacks and norms). The codec's ops are per boundary and do not grow
with the blocks a stage holds, so the ratio falls as stages deepen. MAPL 16x + RVQ (2 levels) at most 1.22x at a
step without a codebook update and 1.31x at one, every second step (2,719 and 2,926 against 2,236; 2,752 and
3,091 before the levels' EMA update ran as one batch and a "none" codebook header was made once per version at
each end; the first was 2,845 before each level's codebook and window were taken once per forward, the last
level's unused residual dropped, the levels' dead-code candidates drawn in one hash and sort and the commitment
loss made one autograd node).
"""

import json

from benchmarks.ops import CONFIG, row_args
from tests.helpers import ROOT, run_train

ONE_PASS_BUDGET = 1.15  # x the single process's ops
MAPL_BUDGET = 1.07  # x the uncompressed virtual pipeline's ops, llama_small
MAPL_134M_BUDGET = 1.05  # the same on the 134m model: the goal of 1.05x, met there
MAPL_MICROBATCHED_BUDGET = 1.05  # the same in the microbatched schedule, llama_small: the goal, met there
RVQ_BUDGET = 1.22  # x the uncompressed virtual pipeline's ops, at a step without a codebook update
RVQ_UPDATE_BUDGET = 1.31  # the same at a step with one (every second step)


def _ops(out, size: str, row: str, step: int = 1) -> int:
    """The aten ops of ``slimpar bench ops``' row ``row`` at model ``size`` and step ``step`` (benchmarks/ops.py)."""
    run_train(out, *row_args(size, row, step), "--log.progress", "false", config=ROOT / "configs" / CONFIG)
    (rank,) = json.loads((out / "summary.json").read_text())["per_rank"]
    return rank["aten_ops"]


def test_virtual_pipeline_ops_within_budget(tmp_path):
    single, none, mapl, rvq = (_ops(tmp_path / str(i), "small", row) for i, row in enumerate(
        ("single", "virtual pipeline, none", "MAPL 4x", "MAPL 16x + RVQ")))
    assert none <= ONE_PASS_BUDGET * single, (none, single)
    assert mapl <= MAPL_BUDGET * none, (mapl, none)
    assert rvq <= RVQ_BUDGET * none, (rvq, none)
    rvq_update = _ops(tmp_path / "rvq_update", "small", "MAPL 16x + RVQ", step=2)
    assert rvq < rvq_update <= RVQ_UPDATE_BUDGET * none, (rvq_update, rvq, none)


def test_mapl_ops_in_the_microbatched_schedule_within_budget(tmp_path):
    """The schedule the goal was set in (every microbatch through every stage in turn): MAPL 4x at most 1.05x none
    on llama_small (8,975 against 8,583; 10,618 against 8,669 when the goal was set)."""
    none = _ops(tmp_path / "none", "small", "microbatched, none")
    mapl = _ops(tmp_path / "mapl", "small", "microbatched, MAPL 4x")
    assert mapl <= MAPL_MICROBATCHED_BUDGET * none, (mapl, none)


def test_mapl_ops_on_the_134m_model_within_budget(tmp_path):
    none = _ops(tmp_path / "none", "134m", "virtual pipeline, none")
    mapl = _ops(tmp_path / "mapl", "134m", "MAPL 4x")
    assert mapl <= MAPL_134M_BUDGET * none, (mapl, none)
