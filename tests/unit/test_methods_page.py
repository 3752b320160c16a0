"""docs/methods.md is the one place the methods and the project's decisions about them are written down: the code
cites it by section title ("docs/methods.md, 'Holder averaging'") or links its anchors, and a citation must lead
to a section that exists. The project once cited a description kept outside the repository, which a reader of
the code could not open; no tracked file may cite it again."""

import re
import subprocess

from tests.helpers import ROOT

PAGE = "docs/methods.md"
SELF = "tests/unit/test_methods_page.py"
OLD = "METHODS" + ".md"  # spelled in two parts so that this file does not cite it itself
# "docs/methods.md, 'A'", and chains such as "docs/methods.md, 'A', 'B' and 'C'"
CITATION = re.compile(r"docs/methods\.md, ('[^']+'(?:(?:, | and )'[^']+')*)")
TITLE = re.compile(r"'([^']+)'")
LINK = re.compile(r"methods\.md#([\w-]+)")


def _tracked() -> dict[str, str]:
    """The text of every tracked text file, line breaks (and the comment marks that continue a line) made spaces,
    so a citation wrapped over two lines still reads as one."""
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    texts = {}
    for name in names:
        path = ROOT / name
        if not path.is_file() or path.suffix in (".png", ".pdf", ".safetensors", ".pt"):
            continue
        text = path.read_bytes().decode("utf-8", errors="ignore")
        texts[name] = re.sub(r"\s*\n\s*(?:# ?)?", " ", text)
    return texts


def _slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _headings() -> set[str]:
    return {m[1].strip() for m in re.finditer(r"^#+ (.+)$", (ROOT / PAGE).read_text(), re.M)}


def test_no_tracked_file_cites_the_description_outside_the_repository():
    found = [name for name, text in _tracked().items() if OLD in text and name != PAGE]
    assert not found, f"{found} cite {OLD}; cite {PAGE} and its section instead"


def test_every_cited_section_of_the_methods_page_exists():
    headings = _headings()
    slugs = {_slug(h) for h in headings}
    cited, missing = 0, []
    for name, text in _tracked().items():
        if name == SELF:
            continue  # this file writes made-up citations to describe the pattern
        for m in CITATION.finditer(text):
            for title in TITLE.findall(m[1]):
                cited += 1
                if title not in headings:
                    missing.append((name, title))
        for anchor in LINK.findall(text):
            cited += 1
            if anchor not in slugs:
                missing.append((name, f"#{anchor}"))
    assert cited >= 25, cited  # the code's citations were found at all
    assert not missing, f"cited sections that {PAGE} lacks: {missing}"


def test_the_citation_pattern_reads_chains_and_wrapped_lines():
    text = re.sub(r"\s*\n\s*(?:# ?)?", " ", "(docs/methods.md, 'Stiefel projector', 'Factorized anchors' and\n"
                                          "# 'Residual vector quantization')")
    assert TITLE.findall(CITATION.search(text)[1]) == ["Stiefel projector", "Factorized anchors",
                                                        "Residual vector quantization"]
    assert _slug("Subnetwork data parallelism (SDP)") == "subnetwork-data-parallelism-sdp"
