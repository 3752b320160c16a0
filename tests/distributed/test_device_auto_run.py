"""A real tiny CPU run under the default ``parallel.device = "auto"``: it prints the device, backend and dtype it
chose, records them in ``config.toml``, and the same command resumes it. Its launcher sees one stand-in GPU for
two workers, so the run shows the documented fallback too: the CPU, with the note that names the counts."""

from __future__ import annotations

import subprocess
import sys

from slimpar.config import load_config
from tests.helpers import ROOT, TINY

# the launcher's process sees one GPU; the workers it starts receive the resolved config and never ask
STANDIN_ONE_GPU = ("import sys, torch; torch.cuda.is_available = lambda: True; torch.cuda.device_count = lambda: 1; "
                   "from slimpar.cli import main; sys.exit(main(sys.argv[1:]))")
SHORT = ["--train.steps", "2", "--eval.batches", "1", "--data.ood", "none", "--checkpoint.export", "false",
         "--log.progress", "false"]


def _train(out, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", STANDIN_ONE_GPU, "train", "--config", str(TINY), "--out", str(out),
           "--parallel.mode", "ddp", "--parallel.workers", "2", *SHORT, *args]
    env = {"PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_an_auto_run_says_what_it_chose_and_resumes(tmp_path):
    out = tmp_path / "run"
    first = _train(out).stdout.splitlines()
    note = [ln for ln in first if ln.startswith("note: 1 GPU here for 2 local workers")]
    assert len(note) == 1 and "--parallel.device cuda --parallel.backend gloo" in note[0], first
    assert first.count("slimpar: device cpu, backend gloo, dtype fp32") == 1, first
    parallel = load_config(out / "config.toml").parallel
    assert (parallel.device, parallel.backend) == ("cpu", "gloo")  # resolved, not "auto"
    again = _train(out).stdout
    assert "resuming from step 2" in again and "settings differ" not in again
