"""Suite-wide settings: one intra-op thread per test process (2 cores are shared with the
subprocess workers some tests start; oversubscribed thread pools make CPU tests many times slower)."""

import torch

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One finished single-process run of the tiny LLaMA (3 steps, with export), shared by the tests that
    only read a run folder (eval, export, lm-eval), so the suite trains it once."""
    from tests.helpers import run_train

    out = tmp_path_factory.mktemp("tiny_run") / "run"
    run_train(out, "--train.steps", "3", "--eval.batches", "2", "--data.ood", "none")
    return out


# The 2-worker torch DDP run that several parity tests compare against (test_baselines, test_sdp_parity).
DDP2_ARGS = ["--parallel.mode", "ddp", "--parallel.workers", "2", "--train.steps", "4", "--eval.batches", "1",
             "--data.ood", "none", "--checkpoint.final", "false"]


@pytest.fixture(scope="session")
def ddp2_run(tmp_path_factory):
    """(run folder, overrides) of one 2-worker DDP run of the tiny LLaMA, trained once per session."""
    from tests.helpers import run_train

    out = tmp_path_factory.mktemp("ddp2") / "run"
    run_train(out, *DDP2_ARGS)
    return out, list(DDP2_ARGS)
