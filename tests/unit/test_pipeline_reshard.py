"""Pipeline checkpoints reshard to another stage count (virtual pipelines, one process, llama_tiny: 4 blocks).

A 4-stage MAPL pipeline (tied embeddings, factorized anchors, 2 RVQ levels) trained 2 steps and saved loads into
2 stages: every model weight and its AdamW state equal the 4-stage run's; the one cut both layouts share
(after block 1) keeps its codec halves (A, anchors, codebooks) and their optimizer state. The other way, a
2-stage checkpoint loaded into 4 stages keeps that cut and restarts the cuts after blocks 0 and 2: their
values are a fresh run's and they have no optimizer state; the PCA start then sets their A and leaves the
kept one's. A same-layout load restores every tensor exactly.
"""

from __future__ import annotations

import pytest
import torch

from slimpar.pipeline.pca import calibrate_virtual
from slimpar.train.build import build_data, build_model
from slimpar.train.checkpoint.dcp import load_checkpoint, save_checkpoint
from slimpar.train.checkpoint.layout import checkpoint_layout
from slimpar.train.run_plan import run_plan
from slimpar.train.strategies.pipeline import VirtualPipelineStrategy
from slimpar.train.validate.checks import load_run_config
from tests.helpers import TINY, VIRTUAL_PIPELINE, batch_fn, single_process_context

CODEC = ["--pipeline.codec", "mapl", "--pipeline.rank", "16", "--pipeline.anchors", "factorized",
         "--pipeline.anchor_dim", "8", "--pipeline.rvq.levels", "2", "--pipeline.rvq.codebook", "32",
         "--pipeline.microbatches", "2", "--model.tie_embeddings", "true"]
CTX = single_process_context()


def _cfg(stages: int):
    return load_run_config(TINY, [*VIRTUAL_PIPELINE, *CODEC, "--pipeline.stages", str(stages)])


@pytest.fixture(scope="module")
def data():
    return build_data(_cfg(2))


def _strategy(data, stages: int, steps: int = 0):
    cfg = _cfg(stages)
    strat = VirtualPipelineStrategy(cfg, build_model(cfg, data), CTX, run_plan(cfg, data.vocab_size))
    opt = strat.build_optimizer(cfg)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        strat.train_step(step, batch_fn(data, cfg))
        strat.clip_grad_norm(cfg.train.grad_clip)
        opt.step()
    return strat, opt


def _saved(data, tmp_path, stages: int):
    strat, opt = _strategy(data, stages, steps=2)
    path = save_checkpoint(tmp_path, 2, strat.checkpoint_module, opt, 0, layout=checkpoint_layout(strat.cfg))
    return strat, opt, path


def _loaded(data, stages: int, path):
    strat, opt = _strategy(data, stages)
    assert load_checkpoint(path, strat.checkpoint_module, opt, None, checkpoint_layout(strat.cfg)) == 2
    return strat, opt


def _by_name(strat, opt) -> dict[str, dict]:
    """Each parameter's optimizer state under its full-model name (the stage prefix dropped)."""
    names = {id(p): n.split("model.", 1)[-1] for n, p in strat.model.named_parameters()}
    return {names[id(p)]: st for p, st in opt.state.items() if "codecs." not in names[id(p)]}


def _codec(strat, stage: int, half: str) -> dict[str, torch.Tensor]:
    sd = strat.stages[stage].codecs[half].state_dict()
    return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def _assert_equal(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k, v in a.items():
        assert torch.equal(v, b[k]), k


def test_four_stages_load_into_two(data, tmp_path, capsys) -> None:
    four, opt4, path = _saved(data, tmp_path, 4)
    two, opt2 = _loaded(data, 2, path)
    want = {k: v for k, v in four.full_state_dict().items() if not k.startswith("codecs.")}
    got = {k: v for k, v in two.full_state_dict().items() if not k.startswith("codecs.")}
    _assert_equal(got, want)
    s4, s2 = _by_name(four, opt4), _by_name(two, opt2)
    assert set(s2) == set(s4)
    for name, st in s4.items():
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(torch.as_tensor(s2[name][k]), torch.as_tensor(st[k])), (name, k)
    _assert_equal(_codec(two, 0, "send0"), _codec(four, 1, "send1"))  # the cut after block 1
    _assert_equal(_codec(two, 1, "recv0"), _codec(four, 2, "recv1"))
    A = two.stages[0].encoder.projector.A
    assert torch.equal(opt2.state[A]["momentum"], opt4.state[four.stages[1].encoder.projector.A]["momentum"])
    out = capsys.readouterr().out
    assert "4 stages -> 2" in out and "boundary after block 1: codec state kept" in out
    assert "boundary after block 0: no longer a cut" in out
    assert two.summary_extras()["pipeline_resume"] == {
        "checkpoint_stages": 4, "stages": 2, "dropped_cuts": [0, 2],
        "boundaries": [{"after_block": 1, "codec_state": "kept"}]}


def test_two_stages_load_into_four_restarting_the_new_cuts(data, tmp_path, capsys) -> None:
    two, _, path = _saved(data, tmp_path, 2)
    four, opt4 = _loaded(data, 4, path)
    fresh, _ = _strategy(data, 4)
    _assert_equal(_codec(four, 1, "send1"), _codec(two, 0, "send0"))
    _assert_equal(_codec(four, 2, "recv1"), _codec(two, 1, "recv0"))
    for stage, half in ((0, "send0"), (1, "recv0"), (2, "send2"), (3, "recv2")):  # the new cuts
        _assert_equal(_codec(four, stage, half), _codec(fresh, stage, half))
        assert not any(p in opt4.state for p in four.stages[stage].codecs[half].parameters())
    out = capsys.readouterr().out
    assert "boundary after block 0: codec state restarted (new cut)" in out
    assert "boundary after block 1: codec state kept" in out
    assert [b["codec_state"] for b in four.summary_extras()["pipeline_resume"]["boundaries"]] == \
        ["restarted", "kept", "restarted"]
    keep = four._pca_keep(2)
    assert keep == frozenset({1}) and four._pca_keep(3) is None  # one PCA start, on the resume's first step
    kept_A = four.stages[1].encoder.projector.A.detach().clone()
    new_A = four.stages[0].encoder.projector.A.detach().clone()
    calibrate_virtual(four.stages, four.pipe.links, [batch_fn(data, four.cfg)(0, 0)[0]], keep)
    assert torch.equal(four.stages[1].encoder.projector.A, kept_A)
    assert torch.equal(four.stages[2].decoder.projector.A, kept_A)
    assert not torch.equal(four.stages[0].encoder.projector.A, new_A)
    assert torch.equal(four.stages[0].encoder.projector.A, four.stages[1].decoder.projector.A)


def test_same_stage_count_restores_every_tensor(data, tmp_path, capsys) -> None:
    two, opt, path = _saved(data, tmp_path, 2)
    again, opt_again = _loaded(data, 2, path)
    _assert_equal(again.full_state_dict(), two.full_state_dict())
    assert "resharding" not in capsys.readouterr().out
    assert len(opt_again.state) == len(opt.state)


def test_an_older_stage_local_checkpoint_still_loads_into_its_layout(data, tmp_path) -> None:
    """Written as slimpar wrote pipelines before (``stage{s}.model.…`` names, no layout.json): read as such."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from slimpar.train.checkpoint.dcp import OPTIONS

    two, opt = _strategy(data, 2, steps=1)
    model_sd, optim_sd = get_state_dict(two.model, opt, options=OPTIONS)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp_path))
    again, opt_again = _strategy(data, 2)
    again.checkpoint_module.load_from(tmp_path, opt_again)
    _assert_equal(again.full_state_dict(), two.full_state_dict())
    assert len(opt_again.state) == len(opt.state)
