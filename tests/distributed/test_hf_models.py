"""Models that are not slimpar's: SDP and pipelines on a Hugging Face LlamaForCausalLM (random weights,
no downloads) under torchrun, against slimpar's Llama with the same weights and the HF model itself."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "tests" / "distributed" / "scripts" / "hf_sdp_pipeline.py"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT)]
    cwd = tmp_path_factory.mktemp("hf")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads((cwd / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("level", ["block", "neuron"])
def test_sdp_on_hf_model_equals_sdp_on_slimpar_llama(ranks, level):
    for r in ranks:
        got = r[level]
        assert got["same_mask"] and got["names_equal"]
        assert got["hf_losses"] == pytest.approx(got["slimpar_losses"], rel=1e-5)
        assert got["max_param_diff"] <= 1e-5
    # the workers trained different subnetworks on different data, then gathered the same full model
    assert ranks[0][level]["hf_losses"] != ranks[1][level]["hf_losses"]


def test_pipeline_cut_from_hf_model_equals_hf_model(ranks):
    last = ranks[-1]
    assert len(last["pipeline_losses"]) == 2
    assert last["pipeline_losses"] == pytest.approx(last["reference_losses"], rel=1e-5)
