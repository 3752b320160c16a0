"""The library's plans are the CLI's plans: ``slimpar.sdp.plan_blocks`` / ``plan_neurons`` on a model built
with the public constructors give exactly the mask that ``slimpar train`` / ``slimpar plan`` use (the run plan's,
``slimpar.train.run_plan``, of the config as the CLI loads it), over model sizes, world sizes, keeps, levels,
assignments and seeds. Before the planning moved into ``slimpar.sdp.planner``, ``plan_neurons`` placed
all unit groups in one global run (whole FFNs per worker) while the CLI placed each layer on its own."""

import itertools

import numpy as np
import pytest
import torch

import slimpar
from slimpar.train.run_plan import run_plan
from slimpar.train.validate.checks import load_run_config

CONFIGS = ["configs/llama_tiny.toml", "configs/llama_small.toml", "configs/resnet_tiny.toml"]
# (workers, keep): coverage needs workers x keep >= 1
SHAPES = [(2, 0.5), (2, 0.75), (3, 0.5), (4, 0.25), (4, 0.5), (4, 0.75)]
SEEDS = [0, 7]


def _cli_plan(config: str, workers: int, *args: str):
    """The plan ``slimpar plan --config CONFIG --parallel.workers N ARGS`` prints."""
    cfg = load_run_config(config, ["--parallel.mode", "sdp", "--parallel.workers", str(workers), *args],
                          training=False)
    return run_plan(cfg).sdp, cfg  # what the CLI prints: the run plan's


def _user_model(config: str) -> torch.nn.Module:
    """The config's model as a library user builds it (public constructors; sizes are all that matter)."""
    cfg = load_run_config(config, [], training=False)
    m = cfg.model
    with torch.device("meta"):
        if m.arch == "llama":
            return slimpar.models.Llama(slimpar.models.LlamaConfig.named(
                m.size, vocab_size=cfg.data.vocab_size, tie_embeddings=m.tie_embeddings))
        w = m.width
        return slimpar.models.ResNet(slimpar.models.ResNetConfig(
            widths=(w, 2 * w, 4 * w, 8 * w), num_classes=m.num_classes, in_channels=m.in_channels))


@pytest.fixture(scope="module", params=CONFIGS)
def config(request):
    return request.param, _user_model(request.param)


@pytest.mark.parametrize("level,assignment", [("block", "cyclic"), ("block", "random"),
                                              ("neuron", "cyclic"), ("neuron", "random")])
def test_library_plans_equal_cli_plans(config, level, assignment):
    path, model = config
    groups = [0, 3] if level == "neuron" else [0]  # 0: the CLI's default grouping (4), plan_neurons' default
    for (n, keep), seed, g in itertools.product(SHAPES, SEEDS, groups):
        cli, _ = _cli_plan(path, n, "--sdp.keep", str(keep), "--sdp.level", level, "--sdp.assignment", assignment,
                           "--train.seed", str(seed), "--sdp.groups", str(g))
        kw = dict(assignment=assignment, seed=seed)
        if level == "block":
            lib = slimpar.sdp.plan_blocks(model, n, keep, **kw)
        else:
            lib = slimpar.sdp.plan_neurons(model, n, keep, **kw) if g == 0 else \
                slimpar.sdp.plan_neurons(model, n, keep, groups=g, **kw)
        case = (path, n, keep, level, assignment, seed, g)
        assert [c.name for c in lib.components] == [c.name for c in cli.components], case
        assert np.array_equal(lib.mask, cli.mask), (case, lib.mask.tolist(), cli.mask.tolist())
        assert (lib.assignment, lib.seed, lib.shared_bytes) == (cli.assignment, cli.seed, cli.shared_bytes), case


def test_neuron_plans_keep_a_fraction_of_every_layer(config):
    """The per-layer rule, which ``slimpar train --sdp.level neuron`` has always used."""
    _, model = config
    plan = slimpar.sdp.plan_neurons(model, 4, 0.5)
    assert plan.assignment == "cyclic per layer"
    for layer in {c.layer for c in plan.components}:
        cols = [i for i, c in enumerate(plan.components) if c.layer == layer]
        assert plan.mask[:, cols].sum(1).tolist() == [2, 2, 2, 2], layer


def test_heterogeneous_keeps_equal_cli():
    path = "configs/llama_tiny.toml"
    model = _user_model(path)
    for level in ("block", "neuron"):
        cli, _ = _cli_plan(path, 4, "--sdp.keep_per_worker", "1,0.5,0.5,0.25", "--sdp.level", level)
        fn = slimpar.sdp.plan_blocks if level == "block" else slimpar.sdp.plan_neurons
        assert np.array_equal(fn(model, 4, [1, 0.5, 0.5, 0.25]).mask, cli.mask), level


@pytest.mark.parametrize("assignment", ["cyclic", "random"])
def test_memory_budget_plans_equal_cli(assignment):
    """Keeps chosen from budgets, and the typed prediction (``Plan.memory``) the CLI reports."""
    path, budget = "configs/llama_tiny.toml", "2x7MiB,2x4.2MiB"
    cli, cfg = _cli_plan(path, 4, "--sdp.memory_budget", budget, "--sdp.assignment", assignment)
    tokens = cfg.train.batch_size // 4 * cfg.data.seq_len
    lib = slimpar.sdp.plan_blocks(_user_model(path), 4, None, assignment=assignment, memory_budget=budget,
                                  tokens_per_worker=tokens)
    assert np.array_equal(lib.mask, cli.mask) and lib.keep_per_worker == [1.0, 1.0, 0.5, 0.5]
    assert isinstance(lib.memory, slimpar.sdp.MemoryPrediction) and lib.memory == cli.memory
    assert list(lib.memory.as_dict()) == ["budgets", "tokens_per_worker", "activation_bytes_per_block", "fixed_bytes",
                                          "state_factor", "predicted_static_bytes", "predicted_activation_bytes",
                                          "predicted_peak_mem_bytes", "model"]
    assert slimpar.sdp.plan_blocks(_user_model(path), 4, 0.5).memory is None


def test_memory_budget_needs_llama_and_tokens():
    with pytest.raises(slimpar.sdp.PlanError, match="tokens_per_worker"):
        slimpar.sdp.plan_blocks(_user_model(CONFIGS[0]), 4, None, memory_budget="7MiB")
    with pytest.raises(slimpar.sdp.PlanError, match="slimpar's LLaMA only"):
        slimpar.sdp.plan_blocks(_user_model(CONFIGS[2]), 4, None, memory_budget="7MiB", tokens_per_worker=64)


def test_neuron_holder_sets_are_refused():
    with pytest.raises(slimpar.sdp.PlanError, match="each layer on its own"):
        slimpar.sdp.plan_neurons(_user_model(CONFIGS[0]), 4, 0.5, assignment="random", holder_sets=2)
