"""torchrun-safe launch (issue 11): the README's torchrun line as written, and torchrun without ``--out``.

Under torchrun the configuration is validated once ``parallel.workers`` is the group's WORLD_SIZE (SDP at
keep 0.5 on 2 workers used to fail as "a single worker"), and every rank writes into the one run folder
that every rank names alike, runs/<config name> (slimpar.train.launch.launcher.default_run_folder).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

from tests.helpers import ROOT, TINY

SHORT = ["--train.steps", "2", "--eval.batches", "1", "--data.ood", "none", "--checkpoint.export", "false"]


def _readme_torchrun_line() -> str:
    section = (ROOT / "README.md").read_text().split("## What `slimpar train` does", 1)[1].split("\n## ", 1)[0]
    (line,) = [ln for ln in section.splitlines() if ln.startswith("torchrun ")]
    return line.split("#", 1)[0].strip()


def _torchrun(args: list[str], cwd, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def test_readme_torchrun_line_runs_as_written(tmp_path):
    words = shlex.split(_readme_torchrun_line())
    assert words[0] == "torchrun" and "--out" in words
    # in an empty folder, where configs/llama_small.toml is the packaged config
    _torchrun([*words[1:], *SHORT, "--log.every", "1"], cwd=tmp_path)
    out = tmp_path / words[words.index("--out") + 1]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    s = json.loads((out / "summary.json").read_text())
    assert s["world_size"] == int(words[words.index("--nproc_per_node") + 1]) and s["steps"] == 2


def test_torchrun_sdp_without_out_validates_at_world_size_and_shares_one_folder(tmp_path):
    _torchrun(["--standalone", "--nproc_per_node", "2", "-m", "slimpar", "train", "--config", str(TINY),
               "--parallel.mode", "sdp", *SHORT], cwd=tmp_path)
    folders = list((tmp_path / "runs").iterdir())
    assert len(folders) == 1, folders  # both ranks wrote into the one folder
    out = folders[0]
    assert out.name == "llama_tiny"  # runs/<config name>: the same command again resumes it
    assert json.loads((out / "summary.json").read_text())["world_size"] == 2
    assert (out / "checkpoints" / "step_000002" / "trainer.json").is_file()
