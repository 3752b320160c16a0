"""README.md is a user's page: short, with the links a user needs on its first screen, and like every page under
docs/ it speaks of what slimpar does, not of the project's issue numbers."""

import re

from tests.helpers import ROOT

README = (ROOT / "README.md").read_text()
# the history of the work, which a user does not have: "issue 20", "Issue 10's targets", "issues 10 and 20"
ISSUE = re.compile(r"\bissues?(?:'s)?\s+#?\d+|\bissue's\b|#\d+\b", re.I)


def _user_pages() -> list:
    """README.md and every Markdown page under docs/, but the generated run records of each results folder."""
    docs = [p for p in (ROOT / "docs").rglob("*.md") if p.name not in ("report.md", "findings.md")]
    return [ROOT / "README.md", *sorted(docs)]


def test_readme_is_at_most_250_lines():
    assert len(README.splitlines()) <= 250, len(README.splitlines())


def test_no_user_page_speaks_of_issue_numbers():
    pages = _user_pages()
    assert len(pages) > 10 and ROOT / "docs/results/README.md" in pages
    found = [(p.relative_to(ROOT), n, ln.strip()[:80]) for p in pages
             for n, ln in enumerate(p.read_text().splitlines(), 1) if ISSUE.search(ln)]
    assert not found, found


def test_the_pattern_catches_the_ways_pages_used_to_name_issues():
    for text in ("(issue 20, item 2)", "Issue 10's targets", "issues 10 and 20", "the issue's target", "see #41"):
        assert ISSUE.search(text), text
    assert not ISSUE.search("8 blocks, keep 0.5, 4 workers; a tissue 3 mm")


def test_the_first_screen_links_the_quick_start_and_the_integrations():
    first = README.split("## What `slimpar train` does", 1)[0]
    assert "## Quick start" in first and "(docs/integrations.md)" in first
    assert len(first.splitlines()) <= 25  # what a user sees before scrolling


def test_the_architecture_page_names_every_room_of_train_and_the_benchmarks():
    arch = (ROOT / "docs" / "architecture.md").read_text()
    rooms = [p.parent for top in (ROOT / "slimpar" / "train", ROOT / "benchmarks") for p in top.glob("*/__init__.py")]
    assert len(rooms) >= 8
    for room in [*rooms, ROOT / "slimpar" / "commands"]:
        assert f"{room.name}/" in arch, room.relative_to(ROOT)
