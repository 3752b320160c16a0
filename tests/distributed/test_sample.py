"""``slimpar sample --run RUN --prompt TEXT`` on the shared tiny run: greedy at temperature 0, the same text for the
same seed, at most N new tokens; and exit 2 with a message for a bad run folder or bad values, before any model
file is read (the error cases use folders whose model.safetensors is not even a safetensors file)."""

import subprocess
import sys

import pytest
import torch

from slimpar.cli import main
from slimpar.commands.sample import load_run_llama, sample_run
from slimpar.config import load_config, to_toml
from slimpar.train.job.run_files import TOKENIZER_FILE
from tests.helpers import ROOT

PROMPT = "ROMEO:"


def test_greedy_is_the_argmax_and_the_cli_prints_prompt_and_text(tiny_run):
    from tokenizers import Tokenizer

    text = sample_run(tiny_run, PROMPT, max_new_tokens=8, temperature=0)
    assert text == sample_run(tiny_run, PROMPT, max_new_tokens=8, temperature=0, seed=1)  # no randomness
    tokenizer = Tokenizer.from_file(str(tiny_run / TOKENIZER_FILE))
    model = load_run_llama(tiny_run, load_config(tiny_run / "config.toml"))
    ids = [tokenizer.token_to_id("<|endoftext|>"), *tokenizer.encode(PROMPT).ids]
    with torch.no_grad():
        first = int(model(torch.tensor([ids]))[0, -1].argmax())
    assert text.startswith(tokenizer.decode([first]))  # an independent first greedy step
    proc = subprocess.run([sys.executable, "-m", "slimpar", "sample", "--run", str(tiny_run), "--prompt", PROMPT,
                           "--max-new-tokens", "8", "--temperature", "0"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == PROMPT + text + "\n"


def test_a_seed_gives_the_same_text_and_top_k_1_is_greedy(tiny_run):
    kw = {"max_new_tokens": 12, "temperature": 1.0, "top_k": 0}
    a, b = sample_run(tiny_run, PROMPT, seed=5, **kw), sample_run(tiny_run, PROMPT, seed=5, **kw)
    assert a == b and a != sample_run(tiny_run, PROMPT, seed=6, **kw)
    greedy = sample_run(tiny_run, PROMPT, max_new_tokens=6, temperature=0)
    assert sample_run(tiny_run, PROMPT, max_new_tokens=6, temperature=2.0, top_k=1, seed=9) == greedy


def _fake_run(path, config, tokenizer=True):
    path.mkdir()
    (path / "config.toml").write_text(to_toml(load_config(config)))
    (path / "model.safetensors").write_text("not a model: sample must refuse before reading it")
    if tokenizer:
        (path / TOKENIZER_FILE).write_text("{}")
    return str(path)


@pytest.mark.parametrize("case, message", [
    ("missing", "no such folder"),
    ("no export", "model.safetensors not found"),
    ("images", "not a text run (model.arch = 'resnet18'"),
    ("no tokenizer", "the run kept no tokenizer"),
    ("--max-new-tokens 0", "--max-new-tokens must be at least 1"),
    ("--temperature -0.5", "--temperature must be a finite number >= 0"),
    ("--temperature nan", "--temperature must be a finite number >= 0"),
    ("--top-k -1", "--top-k must be >= 0"),
    ("--max_new_tokens 10", "spelled with dashes: --max-new-tokens"),
])
def test_bad_runs_and_values_exit_2_before_loading(tmp_path, capsys, case, message):
    run, extra = str(tmp_path / "missing"), []
    if case == "no export":
        run = str(tmp_path / "run")
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "config.toml").write_text("")
    elif case == "images":
        run = _fake_run(tmp_path / "run", ROOT / "configs" / "resnet18_fmnist.toml")
    elif case == "no tokenizer":
        run = _fake_run(tmp_path / "run", ROOT / "configs" / "llama_tiny.toml", tokenizer=False)
    elif case.startswith("--"):
        run, extra = _fake_run(tmp_path / "run", ROOT / "configs" / "llama_tiny.toml"), case.split()
    assert main(["sample", "--run", run, "--prompt", PROMPT, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slimpar: error: ") and message in err and "Traceback" not in err


def test_a_pipeline_export_is_sampled_without_its_codecs(tiny_run, tmp_path):
    """A pipeline run's export holds its codecs' state (``codecs.*``) beside the model: sample leaves it out."""
    import shutil

    from slimpar.train.checkpoint.export import export_safetensors, load_safetensors
    from slimpar.train.checkpoint.manifest import write_manifest

    run = tmp_path / "pipe"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("checkpoints"))
    state = load_safetensors(run / "model.safetensors")
    width = state["tok_embeddings.weight"].shape[1]
    export_safetensors({**state, "codecs.recv0.projector.A": torch.zeros(width, 4)}, run / "model.safetensors", {})
    write_manifest(run, ["model.safetensors"])
    kw = {"max_new_tokens": 5, "temperature": 0}
    assert sample_run(run, PROMPT, **kw) == sample_run(tiny_run, PROMPT, **kw)
