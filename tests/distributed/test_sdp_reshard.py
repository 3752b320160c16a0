"""Reshardable SDP checkpoints (slimpar.train.checkpoint.sdp): one full-name copy of each component.

- In-process (4 gloo processes, SubnetworkDataParallel + AdamW, 2 steps): the saved full state equals,
  for every component, the parameters and AdamW state of each of its holders, bitwise (block and neuron
  level); 2 processes at keep 0.75 then load it and hold exactly their slices of it.
- End to end: 4 workers at keep 0.5 stop after 2 of 4 steps; the checkpoint read in one process equals the
  exported model of the same run at step 2 (bitwise); the folder resumes with 2 workers at keep 0.75
  (block and neuron level), and in a single process; at keep 1.0 the first resumed step equals DDP's.
- A checkpoint that cannot be honoured (another model shape, a pipeline run) is exit 2 before any process
  starts, with nothing written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT, TINY, losses, run_train, summary

COMMON = ["--train.steps", "4", "--eval.batches", "1", "--data.ood", "none", "--log.progress", "false"]
SDP4 = ["--parallel.mode", "sdp", "--parallel.workers", "4", "--sdp.keep", "0.5"]


def _read_checkpoint(path: Path) -> dict:
    """Every tensor of a DCP checkpoint, in one process (verified first: DCP unpickles .metadata)."""
    from slimpar.train.checkpoint.dcp import verify_checkpoint

    verify_checkpoint(path)
    return _read_checkpoint_plain(path)


# ------------------------------------------------------------------------------- in-process holders check


def _cfg(workers: int, level: str, keep: float):
    from slimpar.config import load_config

    return load_config(str(TINY), ["--parallel.mode", "sdp", "--parallel.workers", str(workers),
                                   "--sdp.level", level, "--sdp.keep", str(keep)])


def _worker(rank: int, world: int, tmp: str, level: str, keep: float, mode: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from slimpar.sdp.wrapper import SubnetworkDataParallel
    from slimpar.train.build import build_model, build_optimizer, loss_fn
    from slimpar.train.checkpoint.dcp import OPTIONS
    from slimpar.train.checkpoint.sdp import SDPFullState
    from slimpar.train.strategies.sdp_plan import plan_from_config

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg_{mode}", rank=rank, world_size=world)
    cfg = _cfg(world, level, keep)
    model = build_model(cfg)
    wrapper = SubnetworkDataParallel(model, plan_from_config(cfg, model, world), group=dist.group.WORLD)
    opt = build_optimizer([(n, p) for n, p in model.named_parameters() if p.requires_grad], cfg)
    full = SDPFullState(wrapper, OPTIONS)
    if mode == "save":
        for step in range(2):
            g = torch.Generator().manual_seed(1000 * step + rank)
            x = torch.randint(0, cfg.data.vocab_size, (2, 17), generator=g)
            loss_fn(wrapper(x[:, :-1]), x[:, 1:]).backward()
            wrapper.sync()
            opt.step()
            opt.zero_grad(set_to_none=True)
        m, o = full.state_to_save(opt)
        dcp.save({"model": m, "optim": o}, checkpoint_id=f"{tmp}/ckpt")
    else:
        full.load_from(Path(f"{tmp}/ckpt"), opt)
    msd, osd = get_state_dict(model, opt, options=OPTIONS)
    torch.save({"model": dict(msd), "optim": {k: v for k, v in osd.items() if isinstance(v, torch.Tensor)},
                "index_map": dict(wrapper.sub.index_map), "held": wrapper.sub.held},
               f"{tmp}/{mode}_rank{rank}.pt")
    dist.destroy_process_group()


def _spawn(tmp: Path, world: int, level: str, keep: float, mode: str) -> list[dict]:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(world, str(tmp), level, keep, mode), nprocs=world, join=True)
    return [torch.load(tmp / f"{mode}_rank{r}.pt", weights_only=False) for r in range(world)]


def _local_slice(local: torch.Tensor, index_map: dict, name: str, span: tuple[int, int] | None):
    """A holder's tensor of component span [start, stop) (None: the whole tensor) and the dim."""
    if span is None or name not in index_map:
        return local, 0
    dim, idx = index_map[name]
    pos = ((idx >= span[0]) & (idx < span[1])).nonzero().flatten()
    assert torch.equal(idx[pos], torch.arange(*span)), "a holder holds the whole group, in order"
    return local.index_select(dim, pos), dim


@pytest.mark.parametrize("level", ["block", pytest.param("neuron", marks=pytest.mark.slow)])
def test_full_state_equals_every_holder(tmp_path, level):
    from slimpar.train.build import build_model
    from slimpar.train.strategies.sdp_plan import plan_from_config

    ranks = _spawn(tmp_path, 4, level, 0.5, "save")
    state = _read_checkpoint_plain(tmp_path / "ckpt")
    model = build_model(_cfg(4, level, 0.5))
    plan = plan_from_config(_cfg(4, level, 0.5), model, 4)
    compared = 0
    for c, comp in enumerate(plan.components):
        for h in plan.holders(c):
            for name in comp.params:
                for key, section, stored in ((name, "model", name), (f"state.{name}.exp_avg", "optim", None),
                                             (f"state.{name}.exp_avg_sq", "optim", None)):
                    mine, dim = _local_slice(ranks[h][section][stored or key], ranks[h]["index_map"], name,
                                             comp.index)
                    ref = state[section][key]
                    ref = ref if comp.index is None else ref.narrow(dim, comp.index[0], comp.index[1] - comp.index[0])
                    assert torch.equal(mine, ref), (comp.name, h, key)
                    compared += 1
                assert torch.equal(ranks[h]["optim"][f"state.{name}.step"], state["optim"][f"state.{name}.step"])
    for r in ranks:  # shared parameters: every worker holds them
        for name in plan.shared_params or []:
            assert torch.equal(r["model"][name], state["model"][name]), name
    assert compared > 0
    # the same checkpoint, 2 workers at keep 0.75: each holds exactly its slices of the full state
    loaded = _spawn(tmp_path, 2, level, 0.75, "load")
    for r in loaded:
        for key, t in r["model"].items():
            full = state["model"][key]
            if key in r["index_map"]:
                dim, idx = r["index_map"][key]
                full = full.index_select(dim, idx)
            assert torch.equal(t, full), key
        for key, t in r["optim"].items():
            name = key[len("state."):].rsplit(".", 1)[0]
            full = state["optim"][key]
            if name in r["index_map"] and t.dim() > 0:
                dim, idx = r["index_map"][name]
                full = full.index_select(dim, idx)
            assert torch.equal(t, full), key


def _read_checkpoint_plain(path: Path) -> dict:
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        return _load_state_dict_from_keys(checkpoint_id=str(path))


# ---------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def four(tmp_path_factory) -> dict[str, Path]:
    """4 workers at keep 0.5 (block level), stopped after 2 of 4 steps; and the same run's export at step 2
    (2 steps in all: warm-up lasts 4 steps, so the learning rates of steps 0 and 1 are the same)."""
    root = tmp_path_factory.mktemp("reshard")
    run, ref = root / "run", root / "ref"
    run_train(run, *COMMON, *SDP4, "--train.stop_after", "2", "--checkpoint.export", "false")
    run_train(ref, *COMMON, *SDP4, "--train.steps", "2", "--checkpoint.final", "false")
    return {"run": run, "ref": ref}


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_one_copy_under_full_names_equals_gathered_model(four):
    from slimpar.train.checkpoint.export import load_safetensors

    ckpt = four["run"] / "checkpoints" / "step_000002"
    state = _read_checkpoint(ckpt)
    exported = load_safetensors(four["ref"] / "model.safetensors")
    assert set(exported) == set(state["model"])
    for name, t in exported.items():
        assert torch.equal(state["model"][name], t), name
    assert not any(k.startswith("worker") for k in state["model"])
    layout = json.loads((ckpt / "layout.json").read_text())
    assert layout["names"] == "full" and "layout.json" in json.loads((ckpt / "manifest.json").read_text())["files"]
    print(f"checkpoint bytes: {sum(f.stat().st_size for f in ckpt.iterdir())}")


@pytest.mark.slow  # the suite's time; resharding runs by default in test_first_resumed_step_equals_ddp
def test_resume_with_2_workers_at_another_keep(four, tmp_path):
    out = _copy(four["run"], tmp_path / "two")
    run_train(out, *COMMON, "--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.keep", "0.75",
              "--checkpoint.export", "false")
    assert len(losses(out)) == 4 and losses(out)[:2] == losses(four["run"])
    assert all(torch.isfinite(torch.tensor(losses(out))))
    assert (out / "summary.json").exists()


def test_first_resumed_step_equals_ddp(four, tmp_path):
    """At keep 1.0 every worker holds the full model: SDP's first resumed step is DDP's on the same weights."""
    sdp, ddp = _copy(four["run"], tmp_path / "sdp"), _copy(four["run"], tmp_path / "ddp")
    stop = ["--train.stop_after", "3", "--checkpoint.export", "false"]
    run_train(sdp, *COMMON, "--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.keep", "1.0", *stop)
    run_train(ddp, *COMMON, "--parallel.mode", "ddp", "--parallel.workers", "2", *stop)
    assert losses(sdp)[2] == pytest.approx(losses(ddp)[2], rel=1e-6, abs=0)


@pytest.mark.slow  # the suite's time; resharding runs by default in test_first_resumed_step_equals_ddp
def test_sdp_to_single_process(four, tmp_path):
    out = _copy(four["run"], tmp_path / "single")
    run_train(out, *COMMON, "--parallel.mode", "single", "--checkpoint.export", "false")
    assert len(losses(out)) == 4 and summary(out)["val_loss"] > 0


@pytest.mark.slow  # neuron level, 2 runs each; the block-level reshard runs in the default suite
@pytest.mark.parametrize("regime", ["forward", "backward"])
def test_neuron_level_reshard(tmp_path, regime):
    out = tmp_path / "neuron"
    neuron = ["--sdp.level", "neuron", "--sdp.regime", regime, "--checkpoint.export", "false"]
    run_train(out, *COMMON, *SDP4, *neuron, "--train.stop_after", "2")
    run_train(out, *COMMON, "--parallel.mode", "sdp", "--parallel.workers", "2", "--sdp.keep", "0.75", *neuron)
    assert len(losses(out)) == 4 and (out / "summary.json").exists()


@pytest.mark.parametrize("change, message", [
    (["--parallel.mode", "sdp", "--parallel.workers", "2", "--model.n_kv_heads", "1"], "another model"),
    (["--parallel.mode", "pipeline", "--parallel.workers", "2", "--pipeline.stages", "2"], "cannot load"),
])
def test_unloadable_checkpoint_is_exit_2_before_any_process(four, tmp_path, change, message):
    out = _copy(four["run"], tmp_path / "bad")
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    metrics = (out / "metrics.jsonl").read_bytes()
    cmd = [sys.executable, "-m", "slimpar", "train", "--config", str(TINY), "--out", str(out), *COMMON, *change]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr and "--fresh" in proc.stderr
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    assert (out / "metrics.jsonl").read_bytes() == metrics
