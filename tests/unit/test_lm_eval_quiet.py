"""``slimpar eval --lm-eval`` keeps lm-eval's, datasets' and transformers' progress bars off the terminal unless
``--verbose`` asks for them."""

import sys

import pytest

pytest.importorskip("lm_eval")

import lm_eval  # noqa: E402
import lm_eval.api.model  # noqa: E402
import lm_eval.tasks  # noqa: E402

import slimpar.commands.lm_eval as lm_eval_run  # noqa: E402
from slimpar.config import Config, to_toml  # noqa: E402


def _draw_bars(**_kwargs) -> dict:
    """The bars lm-eval's simple_evaluate draws: its own (a module's tqdm, and tqdm.tqdm imported as it runs),
    datasets' and transformers'."""
    import datasets.utils
    import tqdm
    from transformers.utils import logging as transformers_logging

    for bar in (lm_eval.api.model.tqdm, tqdm.tqdm, datasets.utils.tqdm, transformers_logging.tqdm):
        for _ in bar(range(3), desc="Running loglikelihood requests"):
            pass
    return {"results": {}}


@pytest.fixture
def fake_run(tmp_path, monkeypatch):
    """A run folder whose export, tasks and evaluation are stand-ins: only the bars are real."""
    monkeypatch.setattr(lm_eval, "simple_evaluate", _draw_bars)
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda **kwargs: None)
    monkeypatch.setattr(lm_eval_run, "export_hf", lambda run_dir, out: None)
    monkeypatch.setattr(lm_eval_run, "write_tasks", lambda *args: None)
    (tmp_path / "config.toml").write_text(to_toml(Config()))
    return tmp_path


def test_progress_bars_are_hidden_by_default(fake_run, capsys):
    lm_eval_run.lm_eval_command(str(fake_run), "slimpar_shakespeare_bpb", limit=1)
    assert "Running loglikelihood" not in capsys.readouterr().err


def test_verbose_shows_them(fake_run, capsys):
    lm_eval_run.lm_eval_command(str(fake_run), "slimpar_shakespeare_bpb", limit=1, verbose=True)
    assert capsys.readouterr().err.count("Running loglikelihood") >= 4


def test_quiet_progress_restores_every_switch():
    import datasets
    import tqdm
    from transformers.utils import logging as transformers_logging

    before = (lm_eval.api.model.tqdm, tqdm.tqdm, datasets.are_progress_bars_disabled(),
              transformers_logging.is_progress_bar_enabled())
    with lm_eval_run.quiet_progress():
        assert lm_eval.api.model.tqdm(range(2), file=sys.stderr).disable
        assert not transformers_logging.is_progress_bar_enabled()
    assert before == (lm_eval.api.model.tqdm, tqdm.tqdm, datasets.are_progress_bars_disabled(),
                      transformers_logging.is_progress_bar_enabled())
