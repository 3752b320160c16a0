"""README.md's and the results pages' measured blocks are written from the committed results (slimpar bench readme):
they match, every source they read is named with its commit, their links resolve from the page they land in, the
README's headline figures each link to their results file, and a changed results file makes the check fail."""

import json
import re
import shutil

import pytest

from benchmarks.readme import PAGES, ReadmeError, blocks, format_value, readme_command, regenerate
from tests.helpers import ROOT


def test_readme_matches_the_committed_results(capsys):
    assert readme_command(check=True) == 0, capsys.readouterr().out


def test_every_source_a_template_reads_is_named_with_its_commit():
    for template in (ROOT / "docs/readme").glob("*.md"):
        text = template.read_text()
        used = set(re.findall(r"\{\{(?:table|v|link):([\w-]+):", text))
        named = set(re.findall(r"\{\{(?:measured|commit):([\w-]+)\}\}", text))
        assert used and used <= named, (template.name, used - named)
    new = "".join(page for _, page in regenerate().values())
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
    half = next(ln for ln in data["lines"] if ln["group"] == "llama" and ln["row"] == "B-SDP 0.5")
    half["peak_mem_bytes"] /= 2  # its memory halves: in the README's headline and in the full table
    half["peak_mem_bytes_vs_ddp"] /= 2
    path.write_text(json.dumps(data))
    assert readme_command(check=True, root=copy_of_repo) == 1
    assert "out of date" in capsys.readouterr().out
    assert readme_command(check=False, root=copy_of_repo) == 0
    assert readme_command(check=True, root=copy_of_repo) == 0
    for page in ("README.md", "docs/results/efficiency.md"):  # the headline table, and the full SDP table
        assert (copy_of_repo / page).read_text() != (ROOT / page).read_text(), page


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
    template = copy_of_repo / "docs/readme/efficiency.md"
    template.write_text(template.read_text() + "\n{{v:sdp:llama/No such row:peak_mem_bytes:mib}}\n")
    assert readme_command(check=True, root=copy_of_repo) == 2
    assert "has no line 'llama/No such row'" in capsys.readouterr().out


def test_every_template_fills_one_block_and_no_other_page_has_blocks():
    placed = [name for page in PAGES for name in blocks((ROOT / page).read_text())]
    assert sorted(placed) == sorted(t.stem for t in (ROOT / "docs/readme").glob("*.md"))
    others = [p for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
              if str(p.relative_to(ROOT)) not in PAGES and "docs/readme" not in str(p)]
    assert not [p for p in others if blocks(p.read_text())]  # a block on a page outside PAGES is never checked


def _links(text: str) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t and not t.startswith("#")]


def test_links_in_the_generated_blocks_resolve_from_the_page_they_land_in():
    for page in PAGES:
        path = ROOT / page
        links = [t for body in blocks(path.read_text()).values() for t in _links(body)]
        assert links, page
        for target in links:
            assert (path.parent / target.split("#")[0]).exists(), (page, target)


def test_every_headline_figure_links_to_its_results_file():
    headline = blocks((ROOT / "README.md").read_text())["headline"]
    rows = [r for r in headline.splitlines() if r.startswith("| ") and not r.startswith("| result ")]
    assert len(rows) >= 8
    for row in rows:
        measured = row.split(" | ")[1]
        figures = re.findall(r"\[([^]]+)\]\((docs/results/[\w-]+/(?:results|summary)\.json)\)", measured)
        assert figures and all((ROOT / file).exists() for _, file in figures), row
        assert not re.search(r"\d", re.sub(r"\[[^]]+\]\([^)]+\)", "", measured)), row  # no figure typed by hand
