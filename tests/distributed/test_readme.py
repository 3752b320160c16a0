"""README snippets run as written, and CI runs exactly the README's test command."""

import re
import subprocess
import sys

from tests.helpers import ROOT

README = (ROOT / "README.md").read_text()


def _python_blocks() -> dict[str, str]:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    return {b.splitlines()[0]: b for b in blocks}


def test_quick_start_has_exactly_two_commands_and_ci_runs_the_second():
    quick = README.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick.splitlines() if line.strip()]
    assert len(commands) == 2 and commands[0].endswith("slimpar train")
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_sdp_snippet_runs_under_torchrun(tmp_path):
    (name, code), = [(k, v) for k, v in _python_blocks().items() if k.startswith("# sdp_example.py")]
    script = tmp_path / "sdp_example.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "spectral gap" in proc.stdout


def test_hf_sdp_snippet_runs_under_torchrun(tmp_path):
    (code,) = [v for k, v in _python_blocks().items() if "hf_sdp_example.py" in k]
    script = tmp_path / "hf_sdp_example.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    diff = float(re.search(r"after save/load: ([0-9.e+-]+)", proc.stdout).group(1))
    assert diff == 0.0
