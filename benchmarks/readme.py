"""``slimpar bench readme``: the measured blocks of README.md and of the results pages, written from the committed
results files.

Every measured block of a page in :data:`PAGES` sits between two marker lines::

    <!-- generated NAME: slimpar bench readme writes this block from docs/readme/NAME.md -->
    ...
    <!-- end generated NAME -->

and is the rendering of its template ``docs/readme/NAME.md`` (placeholders: benchmarks/readme_render.py). So a figure
on these pages is never typed by hand: it changes only when a results file does. Templates write their links
from the repository root, and each page gets them relative to its own folder, so one template reads the same
wherever its block lands. ``--check`` renders every block and compares it with the pages instead of writing
(exit 1, naming the pages and blocks that differ); ``tests/unit/test_readme_generated.py`` runs that check.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from benchmarks.readme_render import ReadmeError, Source, format_value, load_source, render  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
# the pages that hold generated blocks, from the repository root: the user's page and the results pages
PAGES = ("README.md", "docs/results/README.md", "docs/results/quality-tuned.md",
         "docs/results/quality-one-rate.md", "docs/results/efficiency.md")
BEGIN = "<!-- generated {name}: slimpar bench readme writes this block from docs/readme/{name}.md -->"
END = "<!-- end generated {name} -->"
_BLOCK = re.compile(r"<!-- generated (?P<name>[\w-]+): .*? -->\n(?P<body>.*?)<!-- end generated (?P=name) -->\n",
                    re.S)
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def blocks(page: str) -> dict[str, str]:
    """The generated blocks of a page's text: name -> body."""
    return {m["name"]: m["body"] for m in _BLOCK.finditer(page)}


def relink(text: str, page: str) -> str:
    """Rewrite the links of rendered Markdown, written from the repository root, relative to ``page``'s folder
    (web addresses and in-page anchors stay as they are)."""
    folder = posixpath.dirname(page) or "."

    def one(m: re.Match) -> str:
        target = m["target"]
        if target.startswith(("#", "/", "mailto:")) or "://" in target:
            return m[0]
        path, hash_, anchor = target.partition("#")
        return f"]({posixpath.relpath(path, folder)}{hash_}{anchor})"

    return _LINK.sub(one, text)


def _has_source(results: Path, name: str) -> bool:
    return (results / name / "results.json").exists() or (results / name / "summary.json").exists()


class _Sources(dict):
    """Results files by name, each loaded the first time a template names it (and once for all pages)."""

    def __init__(self, results: Path):
        super().__init__()
        self.results = results

    def get(self, key, default=None):
        if key not in self and _has_source(self.results, key):
            self[key] = load_source(key, self.results)
        return super().get(key, default)


def regenerate(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """Each page of :data:`PAGES`: its text as it is, and as the templates and results make it."""
    sources: dict[str, Source] = _Sources(root / "docs" / "results")
    pages = {}
    for page in PAGES:
        text = (root / page).read_text()
        if not blocks(text):
            raise ReadmeError(f"{page} has no generated blocks (<!-- generated NAME: ... -->)")

        def fill(m: re.Match, page: str = page) -> str:
            name = m["name"]
            template = (root / "docs" / "readme" / f"{name}.md").read_text()
            body = relink(render(template, sources), page)
            return f"{BEGIN.format(name=name)}\n{body}{END.format(name=name)}\n"

        pages[page] = (text, _BLOCK.sub(fill, text))
    return pages


def readme_command(check: bool, root: Path = ROOT) -> int:
    """Write the pages' generated blocks, or (``check``) say which differ from their templates."""
    try:
        pages = regenerate(root)
    except (ReadmeError, FileNotFoundError) as e:
        print(f"slimpar bench readme: {e}")
        return 2
    stale = {page: [n for n, body in blocks(old).items() if blocks(new).get(n) != body]
             for page, (old, new) in pages.items()}
    stale = {page: names for page, names in stale.items() if names}
    count = sum(len(blocks(new)) for _, new in pages.values())
    if check:
        for page, names in stale.items():
            print(f"{page} is out of date with docs/results in {len(names)} block(s): {', '.join(names)}.")
        if stale:
            print("Run `slimpar bench readme` and commit the pages it writes.")
            return 1
        print(f"The {count} generated blocks of {len(pages)} pages match docs/results.")
        return 0
    for page, (_, new) in pages.items():
        (root / page).write_text(new)
    print(f"{count} generated blocks on {len(pages)} pages written from docs/readme and docs/results; "
          f"changed: {', '.join(stale) or 'none'}.")
    return 0
