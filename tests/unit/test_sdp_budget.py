"""The memory predictor and the keep choice of slimpar.sdp.budget against hand computations."""

import pytest

from slimpar.sdp import PlanError, plan_components
from slimpar.sdp.budget import (
    check_budgets,
    keep_for_budgets,
    llama_activation_bytes,
    parse_budgets,
    parse_size,
    plan_peaks,
    predict_peak,
)
from slimpar.sdp.components import Component

MIB = 2**20


def blocks(k: int, nbytes: int = 1000) -> list[Component]:
    return [Component(f"layers.{i}", nbytes, 1, (f"layers.{i}.w",)) for i in range(k)]


def test_parse_sizes_and_budgets():
    assert parse_size("120MiB") == 120 * MIB
    assert parse_size("1.5 GB") == 1_500_000_000
    assert parse_size("4096") == 4096
    assert parse_budgets("120MiB", 3) == [120 * MIB] * 3
    assert parse_budgets("200MiB, 120MiB,120MiB,80MiB", 4) == [200 * MIB, 120 * MIB, 120 * MIB, 80 * MIB]
    assert parse_budgets(["2x200MiB", "2x100MiB"], 4) == [200 * MIB] * 2 + [100 * MIB] * 2
    assert parse_budgets("1x3KiB,2KiB", 2) == [3072, 2048]
    for bad in ("12 parsecs", "-5MiB", "0", "MiB", "0x10MiB"):
        with pytest.raises(PlanError):
            parse_budgets(bad, 2)
    with pytest.raises(PlanError, match="gives 3 budgets for 4 workers"):
        parse_budgets("2x1MiB,1MiB", 4)


def test_llama_activation_model_by_hand():
    # t = 128 tokens, d = 64, f = 176, H = 4, V = 512 (configs/llama_tiny.toml on 4 workers)
    per_block, fixed = llama_activation_bytes(128, 64, 176, 4, 512, buffer_bytes=32768)
    assert per_block == 4 * 128 * (640 + 704 + 4 + 2) == 691_200
    assert fixed == 4 * 128 * (192 + 1 + 512) + 16 * 128 + 8 + 32768 + 8 * 128 * 512 == 920_072


def test_predict_peak_by_hand():
    held = blocks(2, 1000)
    p = predict_peak(held, shared_bytes=500, activation_bytes=300, fixed_bytes=70)
    assert p == {"static": 4 * (500 + 2000), "activations": 600, "fixed": 70, "peak": 10_000 + 600 + 70}


def test_keep_choice_by_hand():
    # one component costs 4 * 1000 + 300 = 4300; the shared part 4 * 500 + 70 = 2070
    comps = blocks(4)
    peaks = [2070 + 4300 * m for m in range(5)]  # 2070, 6370, 10670, 14970, 19270
    budgets = [19270, 19269, 10670, 6370]
    assert keep_for_budgets(comps, 500, budgets, 300, 70) == [1.0, 0.75, 0.5, 0.25]
    assert peaks[4] == 19270 and peaks[3] == 14970
    # unequal components: the bound takes the heaviest ones first (4 * 3000 + 300 = 12300)
    mixed = [*blocks(3), Component("layers.3", 3000, 1, ("layers.3.w",))]
    two, one = 2070 + 12300 + 4300, 2070 + 12300
    assert keep_for_budgets(mixed, 500, [two, two - 1, two, one], 300, 70) == [0.5, 0.25, 0.5, 0.25]


def test_keep_choice_errors_name_the_fix():
    comps = blocks(4)
    with pytest.raises(PlanError, match=r"worker\(s\) \[1\] cannot hold even one component"):
        keep_for_budgets(comps, 500, [20000, 6369], 300, 70)
    # two workers holding one component each cover 2 of 4: a uniform 10670 (2 each) would work
    with pytest.raises(PlanError, match=r"fit \[1, 1\] of 4 .* 10.4 KiB for every worker \(2 of 4"):
        keep_for_budgets(comps, 500, [6370, 6370], 300, 70)
    with pytest.raises(PlanError, match="min_holders=2 needs 8"):
        keep_for_budgets(comps, 500, [14970, 10670, 6370, 6370], 300, 70, min_holders=2)


def test_plan_from_budget_keeps_fits_and_matches():
    comps, budgets = blocks(4), [19270, 19270, 10670, 10670]
    keep = keep_for_budgets(comps, 500, budgets, 300, 70)
    plan = plan_components(comps, 500, 4, keep)
    peaks = plan_peaks(plan, 300, 70)
    assert [p["peak"] for p in peaks] == [19270, 19270, 10670, 10670]
    assert [p["static"] for p in peaks] == [4 * b for b in plan.bytes_per_worker]
    check_budgets(peaks, budgets)
    with pytest.raises(PlanError, match="exceeds memory budgets"):
        check_budgets(peaks, [19270, 19270, 10670, 10669])
