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
