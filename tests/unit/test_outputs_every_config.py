"""Output for every config: the closing table also with ``log.progress = false``, log lines with elapsed time,
ETA and throughput, and validation on the way by default for long runs (``eval.every = 0``: auto)."""

from types import SimpleNamespace

import pytest
import torch

import slimpar.train.sinks.progress as progress
import slimpar.train.trainer as trainer
from slimpar.config import load_config
from slimpar.train.build import eval_every
from tests.helpers import TINY


def test_closing_table_is_printed_without_the_progress_bar(tmp_path, monkeypatch):
    cfg = load_config(TINY, ["--checkpoint.export", "false"])
    assert cfg.log.progress is False  # llama_tiny silences its bar
    tables = []
    monkeypatch.setattr(trainer, "print_summary", lambda summary, rows: tables.append(summary))
    fake = SimpleNamespace(cfg=cfg, ctx=SimpleNamespace(out_dir=tmp_path, world=1, device=torch.device("cpu")),
                           data=SimpleNamespace(vocab_size=512), step_times=[0.1], losses=[2.0],
                           strategy=SimpleNamespace(summary_extras=dict, summary_rows=lambda s: [],
                                                    val_gap_fix=lambda: ""),
                           guard=SimpleNamespace(skipped=[]), total=20, items_per_step=512, sinks=[],
                           start=0, resumed_from=None)
    trainer.Trainer._write_outputs(fake, {"val_loss": 3.0}, [None], None)
    assert len(tables) == 1 and tables[0]["train_loss"] == 2.0
    assert (tmp_path / "summary.json").is_file()
    assert tables[0]["mfu"] is None and tables[0]["model_flops_per_token"] > 0  # a CPU run: no peak to divide by


def test_log_lines_carry_elapsed_eta_and_throughput(capsys):
    p = progress.TrainProgress(True, 40, 100, items_per_step=1024)  # pytest's stdout is no TTY: plain lines
    assert p.lines and p.bar is None
    assert p.line(50, 3.25, now=p.t0 + 20) == "step 50/100  loss 3.2500  elapsed 0:20  eta 1:40  512 tok/s"
    p.update(60, 3.0)
    out = capsys.readouterr().out
    assert out.startswith("step 60/100  loss 3.0000  elapsed ") and " eta " in out and "tok/s" in out
    assert progress.clock(3723) == "1:02:03"


@pytest.mark.parametrize("steps, every, log_every, want", [
    (100, 0, 10, 0),  # a short run: only at the end, as before
    (499, 0, 1, 0),
    (500, 0, 10, 50),  # auto: ~10% of the run, on a logged step
    (2000, 0, 10, 200),
    (1000, 0, 30, 90),
    (2000, -1, 10, 0),  # -1: only at the end
    (2000, 25, 10, 25),  # explicit
])
def test_eval_every_auto_for_long_runs(steps, every, log_every, want):
    cfg = load_config(TINY, ["--train.steps", str(steps), "--eval.every", str(every), "--log.every", str(log_every)])
    assert eval_every(cfg, steps) == want
