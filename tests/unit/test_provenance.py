"""Run records name slimpar's own commit, never that of a repository slimpar merely sits inside."""

import shutil
import subprocess
import sys

import slimpar
from slimpar.train.sinks.metrics import git_commit
from tests.helpers import ROOT


def test_commit_of_the_slimpar_checkout():
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert git_commit() == head


def test_installed_copy_inside_another_repository_reports_no_commit(tmp_path):
    user_repo = tmp_path / "user_repo"
    site = user_repo / ".venv" / "site-packages"
    site.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(user_repo)], check=True)
    subprocess.run(["git", "-C", str(user_repo), "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q",
                    "--allow-empty", "-m", "user"], check=True)
    shutil.copytree(ROOT / "slimpar", site / "slimpar", ignore=shutil.ignore_patterns("__pycache__"))
    code = "import sys; from slimpar.train.sinks.metrics import git_commit; print(git_commit())"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"
    assert slimpar.__version__
