"""The snippets of README.md and docs/huggingface.md run as written and end cleanly, and CI runs exactly the README's
test command."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.floor  # the README's snippets run on the floor torch too (.ci/floor)

README = (ROOT / "README.md").read_text()


def _python_blocks(text: str) -> dict[str, str]:
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return {b.splitlines()[0]: b for b in blocks}


def _torchrun(code: str, name: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run a snippet as its first line says (torchrun, 2 processes); it must exit 0 without a C++ abort: a rank
    that tears down its process group while a peer still talks to it ends in "terminate called" (rc 1)."""
    script = tmp_path / name
    script.write_text(code)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "terminate called" not in proc.stderr, proc.stderr[-4000:]
    return proc


def test_quick_start_has_exactly_two_commands_and_ci_runs_the_second():
    quick = README.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick.splitlines() if line.strip()]
    assert len(commands) == 2 and commands[0].endswith("slimpar train")
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_every_snippet_that_destroys_its_group_passes_a_barrier_first():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    ends = 0
    for page in pages:
        for code in _python_blocks(page.read_text()).values():
            lines = [ln.split("#")[0].strip() for ln in code.splitlines()]
            for i, line in enumerate(lines):
                if line == "dist.destroy_process_group()":
                    ends += 1
                    assert i > 0 and lines[i - 1] == "dist.barrier()", (page.name, code.splitlines()[0])
    assert ends >= 4  # the README's SDP and MAPL snippets, docs/huggingface.md's and docs/pipeline.md's


def test_sdp_snippet_runs_under_torchrun(tmp_path):
    (code,) = [v for k, v in _python_blocks(README).items() if k.startswith("# sdp_example.py")]
    proc = _torchrun(code, "sdp_example.py", tmp_path)
    assert "spectral gap" in proc.stdout


def test_mapl_snippet_runs_under_torchrun_and_sends_what_the_readme_says(tmp_path):
    (code,) = [v for k, v in _python_blocks(README).items() if k.startswith("# mapl_example.py")]
    proc = _torchrun(code, "mapl_example.py", tmp_path)
    payload = 2 * 2 * 32 * 16 * 4  # microbatches × 2 sequences × 32 tokens × rank 16 × fp32, each step
    a_grad = 64 * 16 + 64 * 4  # A's gradient part: int8 (d × r) and a float32 scale per row
    # CodecSpec.mapl's PCA start, once: rank 0 sends A (d × r fp32) and the calibration codes (4 × 32 tokens × r fp32);
    # its receiver-only anchors and locally read ids send nothing
    pca = 64 * 16 * 4 + 4 * 32 * 16 * 4
    assert f"{payload:,} payload bytes a step" in README and f"{a_grad:,} bytes of A's" in README
    assert f"rank 0 adds {pca:,} bytes once, for the PCA start" in README
    assert f"rank 0 sent {3 * (payload + a_grad) + pca} bytes in 3 steps" in proc.stdout, proc.stdout
    assert f"rank 1 sent {3 * (payload + a_grad)} bytes in 3 steps" in proc.stdout, proc.stdout


def test_hf_sdp_snippet_runs_under_torchrun(tmp_path):
    hf = (ROOT / "docs" / "huggingface.md").read_text()
    (code,) = [v for k, v in _python_blocks(hf).items() if "hf_sdp_example.py" in k]
    proc = _torchrun(code, "hf_sdp_example.py", tmp_path)
    diff = float(re.search(r"after save/load: ([0-9.e+-]+)", proc.stdout).group(1))
    assert diff == 0.0
