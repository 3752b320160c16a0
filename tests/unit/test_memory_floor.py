"""The memory floor of every mode (issue 40, slimpar/train/validate/memory_floor.py): what each worker holds, checked
against the parameters of the real subnetworks and stages the strategies build, and the refusal of a run that cannot
fit this machine (the SDP keep, pipeline stages, FSDP shards and the workers sharing the machine all counted)."""

from __future__ import annotations

import time

import pytest

from slimpar.config import load_config
from slimpar.train.validate import memory_floor
from slimpar.train.validate.memory_floor import PROCESS_BYTES, _logits_bytes, local_ranks, rank_floors
from tests.bad_input import expect_exit_2
from tests.helpers import TINY

VOCAB = 512
GiB = 1 << 30


class _Vocab:
    vocab_size = VOCAB


def _cfg(*overrides: str):
    return load_config(TINY, ["--parallel.workers", "2", *overrides])


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in params}.values())


def _state(floors: list[int], cfg) -> list[int]:
    """The floors less the process and one micro-batch's logits: parameters, gradients and AdamW state."""
    return [f - PROCESS_BYTES - _logits_bytes(cfg, VOCAB) for f in floors]


@pytest.mark.parametrize("regime", ["forward", "backward"])
def test_an_sdp_workers_floor_is_its_subnetworks_state(regime):
    from slimpar.sdp.apply import apply_subnet
    from slimpar.train.build import build_model
    from slimpar.train.strategies.sdp_plan import plan_from_config

    cfg = _cfg("--parallel.mode", "sdp", "--sdp.keep", "0.5", "--sdp.regime", regime)
    want = []
    for rank in range(2):
        model = build_model(cfg, _Vocab())
        apply_subnet(model, plan_from_config(cfg, model, 2), rank, regime=regime)
        params = list(model.parameters())
        trained = _bytes(p for p in params if p.requires_grad)  # gradients and both AdamW moments
        want.append(_bytes(params) + 3 * trained)
    assert _state(rank_floors(cfg, VOCAB), cfg) == want
    full = 4 * _bytes(build_model(cfg, _Vocab()).parameters())
    assert all(w < full for w in want)  # the keep counts: each holds less than the whole model


@pytest.mark.parametrize("tied", ["true", "false"])
def test_a_pipeline_workers_floor_is_its_stages_state(tied):
    from slimpar.pipeline.split import prune_to_stage
    from slimpar.train.build import build_model

    cfg = _cfg("--parallel.mode", "pipeline", "--pipeline.stages", "2", "--model.tie_embeddings", tied)
    want = [4 * _bytes(prune_to_stage(build_model(cfg, _Vocab()), s, 2).parameters()) for s in range(2)]
    floors = rank_floors(cfg, VOCAB)
    assert [f - PROCESS_BYTES for f in floors] == [want[0], want[1] + _logits_bytes(cfg, VOCAB)]  # logits: last


def test_fsdp_shards_and_ddp_copies():
    from slimpar.train.build import build_model

    whole = 4 * _bytes(build_model(_cfg(), _Vocab()).parameters())
    assert _state(rank_floors(_cfg("--parallel.mode", "ddp"), VOCAB), _cfg()) == [whole, whole]
    assert _state(rank_floors(_cfg("--parallel.mode", "fsdp"), VOCAB), _cfg()) == [whole // 2, whole // 2]


def test_the_ranks_on_this_machine(monkeypatch):
    cfg = _cfg("--parallel.mode", "ddp", "--parallel.workers", "4")
    assert local_ranks(cfg, in_process=False) == [0, 1, 2, 3]  # slimpar's launcher: every worker here
    assert local_ranks(cfg, in_process=True) == [0]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun, second node of two: ranks 2 and 3
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert local_ranks(cfg, in_process=False) == [2, 3]


def test_a_1b_sdp_run_of_4_workers_is_refused_on_a_24_gib_machine(tmp_path, capsys, monkeypatch):
    """The issue's probe: every rank passed the old floor (each parameter counted once) and the kernel killed rank 3
    at 23.3 GiB. Each of the 4 workers holds about half the model (keep 0.5): refused at once, with settings that
    fit, each leaving a quarter of the memory to spare."""
    monkeypatch.setattr(memory_floor, "machine_bytes", lambda cfg: 24 * GiB)
    monkeypatch.chdir(tmp_path)
    args = ["--config", str(TINY), "--parallel.mode", "sdp", "--model.size", "1b", "--parallel.workers", "4"]
    t0 = time.perf_counter()
    err = expect_exit_2(["train", *args, "--out", str(tmp_path / "run")], tmp_path, capsys,
                        ("needs at least", "which has 24.0 GiB", "4 worker(s) here", "SDP subnetwork (keep 0.5)",
                         "Settings that fit: --sdp.keep"))
    assert time.perf_counter() - t0 <= 10
    settings = err.split("Settings that fit: ")[1].split(". Otherwise")[0].split(", --")
    assert len(settings) == 3
    for setting in settings:
        flag, value = setting.removeprefix("--").split(" (")[0].split(" ")
        cfg = load_config(TINY, [*args[2:], f"--{flag}", value])
        need, _ = memory_floor.need_bytes(cfg, VOCAB)
        assert need <= 0.75 * 24 * GiB, setting


def test_near_the_edge_the_prediction_of_plan_memory_decides(monkeypatch):
    """Where the floor takes half the memory or more, the launcher predicts the heaviest worker here (FakeTensorMode,
    as ``slimpar plan --memory``) and scales every worker's floor by its peak over its floor; below half it does not
    predict at all (slimpar/train/memory/floor_check.py)."""
    from slimpar.config import ConfigError
    from slimpar.train.memory import floor_check, predict
    from slimpar.train.validate.memory_floor import need_bytes

    cfg = _cfg("--parallel.mode", "sdp", "--sdp.keep", "0.5", "--model.vocab_size", str(VOCAB))
    need, _ = need_bytes(cfg, VOCAB)
    floors = rank_floors(cfg, VOCAB)
    monkeypatch.setattr(memory_floor, "machine_bytes", lambda cfg: 3 * need)  # a third: no prediction
    monkeypatch.setattr(predict, "predict_memory", lambda *a, **k: pytest.fail("predicted below the edge"))
    floor_check.check_predicted_floor(cfg)
    monkeypatch.undo()
    real, seen = predict.predict_memory, {}
    monkeypatch.setattr(predict, "predict_memory",  # the real prediction, made once for both uses below
                        lambda c, ranks, vocab: seen.get(tuple(ranks)) or seen.setdefault(tuple(ranks),
                                                                                          real(c, ranks, vocab)))
    heaviest = max(range(2), key=floors.__getitem__)
    peak = predict.predict_memory(cfg, [heaviest], VOCAB)[0]["peak_live"] + PROCESS_BYTES
    predicted = need * peak / floors[heaviest]
    assert predicted > need  # a step allocates more than the floor
    monkeypatch.setattr(memory_floor, "machine_bytes", lambda cfg: int(predicted) - (1 << 20))
    with pytest.raises(ConfigError, match=f"predicts .* for rank {heaviest}") as e:
        floor_check.check_predicted_floor(cfg)
    assert "this run's predicted peak is" in str(e.value) and "worker(s) here" in str(e.value)
    assert list(seen) == [(heaviest,)]  # one rank predicted: the heaviest
