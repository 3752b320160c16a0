"""The Python snippet of docs/pipeline.md runs as documented (``torchrun --nproc_per_node 2``, gloo)
and sends what its closing sentence says: per step 8,192 payload bytes and 1,280 bytes of A's gradient, and once,
from rank 0, the PCA start of ``CodecSpec.mapl``: A (4,096 sync bytes) and the calibration codes (8,192 payload)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers import ROOT

DOC = ROOT / "docs" / "pipeline.md"


def test_docs_snippet_runs_under_torchrun(tmp_path) -> None:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if "ScheduleGPipe" in b]
    assert len(blocks) == 1  # the runnable example (the hybrid section's block is a fragment)
    script = tmp_path / "pp_mapl.py"
    script.write_text(blocks[0])
    # PYTHONPATH: the snippet runs from a scratch folder and must import this checkout of slimpar
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr, proc.stderr[-3000:]  # it ends cleanly (a barrier, then destroy)
    out = proc.stdout
    step_losses = [float(v) for v in re.findall(r"step \d: loss ([0-9.]+)", out)]
    assert len(step_losses) == 3 and step_losses[-1] < step_losses[0]
    steps = 3
    pca_a, pca_codes = 64 * 16 * 4, 4 * 32 * 16 * 4
    doc = DOC.read_text()
    assert f"{pca_a:,} `sync` bytes" in doc and f"{pca_codes:,} `payload` bytes" in doc
    assert f"rank 0 sent {steps * (8192 + 1280) + pca_a + pca_codes} bytes" in out
    assert f"rank 1 sent {steps * (8192 + 1280)} bytes" in out  # receiver anchors and local ids: nothing more
    assert f"(0, 'fwd', 'payload'): {steps * 8192 + pca_codes}" in out
    assert f"(0, 'fwd', 'sync'): {steps * 1280 + pca_a}" in out and f"(0, 'bwd', 'sync'): {steps * 1280}" in out
    orth = [float(v) for v in re.findall(r"\|AᵀA - I\| = ([0-9.e+-]+)", out)]
    assert len(orth) == 2 and max(orth) <= 1e-5
