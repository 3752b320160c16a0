"""docs/integrations.md: every Python block is one of the page's runnable examples, and each runs exactly as
written under ``torchrun --nproc_per_node 2`` (gloo, CPU), ends cleanly and prints what the page says it does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

DOC = ROOT / "docs" / "integrations.md"
EXAMPLES = ["hf_trainer_example.py", "accelerate_example.py", "lightning_example.py", "parallelize_example.py",
            "pipelining_example.py"]


def _examples() -> dict[str, str]:
    """file name (from each block's first line, ``# NAME.py — run with: torchrun ...``) -> the block."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    named = {re.match(r"# (\S+\.py) — run with: torchrun --nproc_per_node 2 \1", b).group(1): b for b in blocks}
    assert len(named) == len(blocks)  # every block is a runnable example
    return named


def _torchrun(name: str, tmp_path: Path, ranks: int = 2, **env: str) -> str:
    """The block saved as ``name`` and run from a scratch folder; its stdout. It must exit 0 without a C++ abort."""
    script = tmp_path / name
    script.write_text(_examples()[name])
    full_env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", **env,
                    PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=full_env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "terminate called" not in proc.stderr, proc.stderr[-4000:]
    return proc.stdout


def test_the_page_holds_one_example_per_stack():
    assert sorted(_examples()) == sorted(EXAMPLES)


def test_hf_trainer_example_trains_sdp_and_its_saved_model_loads(tmp_path):
    out = _torchrun("hf_trainer_example.py", tmp_path)
    m = re.search(r"rank 0 trained (\d) of 4 blocks; eval loss ([0-9.]+) -> ([0-9.]+); from_pretrained: ([0-9.]+)", out)
    assert m, out[-2000:]
    held, before, after, reloaded = int(m.group(1)), *map(float, m.group(2, 3, 4))
    assert held < 4 and after < before - 1.0
    assert reloaded == pytest.approx(after, abs=1e-4)  # the saved model is the model trained and evaluated
    assert (tmp_path / "hf_sdp_run" / "checkpoint-20" / "optimizer_sdp.rank1.pt").exists()


def test_accelerate_example_trains_and_saves_the_gathered_model(tmp_path):
    out = _torchrun("accelerate_example.py", tmp_path)
    m = re.search(r"train loss ([0-9.]+) -> ([0-9.]+); held-out loss ([0-9.]+) \(saved\), ([0-9.]+) \(gathered\)", out)
    assert m, out[-2000:]
    first, last, saved, gathered = map(float, m.groups())
    assert last < first - 1.0 and saved == gathered


def test_lightning_example_trains_validates_the_full_model_and_checkpoints_it(tmp_path):
    out = _torchrun("lightning_example.py", tmp_path)
    m = re.search(r"rank 0 trained (\d) of 4 blocks; val loss ([0-9.]+) -> ([0-9.]+); checkpoint holds (\d) blocks",
                  out)
    assert m, out[-2000:]
    assert int(m.group(1)) < 4 and int(m.group(4)) == 4 and float(m.group(3)) < float(m.group(2)) - 1.0


def _losses(out: str) -> list[float]:
    return [float(v) for v in re.findall(r"step \d: loss ([0-9.]+)", out)]


def _parallelize_example(tmp_path, **kw) -> str:
    out = tmp_path / ("four" if kw else "two")
    out.mkdir()
    return _torchrun("parallelize_example.py", out, **kw)


def test_parallelize_example_runs_as_written(tmp_path):
    """2 ranks, 2 SDP workers: trains, and the holders' copies stay identical."""
    two = _parallelize_example(tmp_path)
    assert len(_losses(two)) == 5 and _losses(two)[-1] < _losses(two)[0] - 0.3
    assert "holder copies identical" in two


@pytest.mark.slow  # a 4-rank torchrun (~20 s); SDP over holder FSDP2 equals SDP by default: test_sdp_holder_fsdp
def test_parallelize_example_sdp_over_fsdp2_shards_equals_sdp_over_replicas(tmp_path):
    """As written (2 ranks: 2 SDP workers) and with FSDP=2 on 4 ranks (2 SDP workers of 2 FSDP ranks each): AC,
    torch.compile and FSDP2 between the cut and the holder sync change nothing in the losses."""
    two = _parallelize_example(tmp_path)
    four = _parallelize_example(tmp_path, ranks=4, FSDP="2")
    assert _losses(four) == pytest.approx(_losses(two), abs=1e-5)
    assert "holder copies identical" in four


def test_pipelining_example_sends_mapl_codes_and_keeps_a_orthonormal(tmp_path):
    out = _torchrun("pipelining_example.py", tmp_path)
    losses = _losses(out)
    assert len(losses) == 5 and losses[-1] < losses[0]
    steps = 5
    assert f"rank 0 sent {steps * (8192 + 1280)} bytes" in out and f"rank 1 sent {steps * (8192 + 1280)} bytes" in out
    assert f"(0, 'fwd', 'payload'): {steps * 8192}" in out and f"(0, 'bwd', 'payload'): {steps * 8192}" in out
    orth = [float(v) for v in re.findall(r"\|AᵀA - I\| = ([0-9.e+-]+)", out)]
    assert len(orth) == 2 and max(orth) <= 1e-5
