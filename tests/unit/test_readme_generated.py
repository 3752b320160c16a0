"""README.md's measured sections are written from the committed results (slimpar bench readme): they match,
every source they read is named with its commit, and a changed results file makes the check fail."""

import json
import re
import shutil

import pytest

from slimpar.bench.readme import ReadmeError, format_value, readme_command, regenerate
from tests.helpers import ROOT


def test_readme_matches_the_committed_results(capsys):
    assert readme_command(check=True) == 0, capsys.readouterr().out


def test_every_source_a_template_reads_is_named_with_its_commit():
    for template in (ROOT / "docs/readme").glob("*.md"):
        text = template.read_text()
        used = set(re.findall(r"\{\{(?:table|v):([\w-]+):", text))
        named = set(re.findall(r"\{\{measured:([\w-]+)\}\}", text))
        assert used and used <= named, (template.name, used - named)
    _, new = regenerate()
    assert re.search(r"\*Measured at commit `[0-9a-f]{7}`, \d{4}-\d\d-\d\d", new)
    assert "different commits" in new  # the quality runs span commits, and the README says so


@pytest.fixture
def copy_of_repo(tmp_path):
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs/readme", tmp_path / "docs/readme")
    shutil.copytree(ROOT / "docs/results", tmp_path / "docs/results",
                    ignore=shutil.ignore_patterns("*.png", "runs", "diagnostics"))
    return tmp_path


def test_a_changed_result_makes_the_check_fail_and_the_write_fixes_it(copy_of_repo, capsys):
    path = copy_of_repo / "docs/results/sdp/results.json"
    data = json.loads(path.read_text())
    ddp = next(ln for ln in data["lines"] if ln["row"] == "DDP")
    ddp["peak_mem_bytes"] *= 2  # every "× DDP" memory ratio halves
    path.write_text(json.dumps(data))
    assert readme_command(check=True, root=copy_of_repo) == 1
    assert "out of date" in capsys.readouterr().out
    assert readme_command(check=False, root=copy_of_repo) == 0
    assert readme_command(check=True, root=copy_of_repo) == 0
    assert (copy_of_repo / "README.md").read_text() != (ROOT / "README.md").read_text()


def test_formats_and_bad_placeholders():
    ln = {"row": "x", "r": 0.6, "g": 0.0962, "g_std": 0.0073, "b": 3 * 2**20}
    assert [format_value(ln, "r", s) for s in ("f2", "chg0", "pct1")] == ["0.60", "-40%", "+60.0%"]
    assert format_value(ln, "g", "pmpct1") == "+9.6% ± 0.7" and format_value(ln, "b", "mib") == "3.0 MiB"
    for spec in ("f", "mib2", "nope1"):
        with pytest.raises(ReadmeError):
            format_value(ln, "r", spec)
    with pytest.raises(ReadmeError, match="no field"):
        format_value(ln, "missing", "f2")


def test_an_unknown_row_is_one_clear_error(copy_of_repo, capsys):
    template = copy_of_repo / "docs/readme/measured.md"
    template.write_text(template.read_text() + "\n{{v:sdp:llama/No such row:peak_mem_bytes:mib}}\n")
    assert readme_command(check=True, root=copy_of_repo) == 2
    assert "has no line 'llama/No such row'" in capsys.readouterr().out
