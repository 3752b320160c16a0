"""docs/api.md is written from the docstrings (``python -m benchmarks.api_doc``): the committed page is what the code
gives, it lists every library package and every name their ``__all__`` exports, it is written the same on every
machine and without the optional frameworks, and a stale page fails the check until the write fixes it."""

import subprocess
import sys

import pytest

from benchmarks.api_doc import COMMAND, PAGE, api_doc_command, generate, signature_text
from benchmarks.api_source import first_paragraph, value_text
from tests.helpers import ROOT


@pytest.fixture(scope="module")
def page():
    return generate()


def test_the_committed_page_matches_the_docstrings(page):
    assert page == (ROOT / PAGE).read_text(), f"{PAGE} is out of date: run `{COMMAND}` and commit it"


def test_every_library_and_every_exported_name_is_on_the_page(page):
    import slimpar

    libraries = [f"slimpar.{n}" for n in slimpar.__all__ if (ROOT / "slimpar" / n / "__init__.py").exists()]
    assert len(libraries) >= 9
    for package in ["slimpar", *libraries, "slimpar.plan"]:
        assert f"\n## {package}\n" in page, package
        for name in __import__(package, fromlist=["__all__"]).__all__:
            assert f"\n### `{package}.{name}` · " in page, (package, name)
    assert "\n## slimpar.train" not in page and "\n## slimpar.commands" not in page  # the application
    # every exported class and function says what it is (the conventions: public names are documented)
    assert "*(no docstring)*" not in page, [e.split("\n", 1)[0] for e in page.split("\n### ") if "no docstring" in e]


def test_the_integrations_are_written_without_their_frameworks():
    """Blocking the frameworks' imports (None in sys.modules) must leave the page as committed."""
    script = ("import sys\nfor m in ('transformers', 'accelerate', 'lightning'):\n    sys.modules[m] = None\n"
              "from benchmarks.api_doc import api_doc_command\nsys.exit(api_doc_command(check=True))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (ROOT / PAGE).read_text()
    for module, extra in (("hf", "slimpar[hf]"), ("lightning", "slimpar[lightning]")):
        entry = text.split(f"### `slimpar.integrations.{module}` · module", 1)[1].split("\n### ", 1)[0]
        assert f"Needs `{extra}`" in entry, entry


def test_a_stale_page_fails_the_check_and_the_write_fixes_it(tmp_path, capsys, page):
    (tmp_path / "docs").mkdir()
    (tmp_path / PAGE).write_text(page.replace("Single-device models", "Models"))
    assert api_doc_command(check=True, root=tmp_path) == 1
    assert COMMAND in capsys.readouterr().out  # the message says how to bring it up to date
    assert api_doc_command(check=False, root=tmp_path) == 0
    assert (tmp_path / PAGE).read_text() == page
    assert api_doc_command(check=True, root=tmp_path) == 0


def test_values_read_the_same_on_every_machine():
    class Opaque:
        pass

    assert value_text(Opaque()) == "Opaque(...)"  # not "<...Opaque object at 0x7f...>"
    assert value_text(frozenset({"b", "a", "c"})) == "frozenset({'a', 'b', 'c'})"  # not hash order
    assert value_text({"k": {2, 1}}) == "{'k': {1, 2}}"
    assert value_text(lambda: 0) == "test_values_read_the_same_on_every_machine.<locals>.<lambda>"
    assert value_text("x" * 300).endswith(" ...") and len(value_text("x" * 300)) < 110


def test_signatures_and_summaries():
    def f(a, /, b: int = 1, *, c: "list[int] | None" = None) -> str:
        """Says what f does:

        - one
        - two

        Details that stay in the source."""

    assert signature_text("f", f) == "f(a, /, b: int = 1, *, c: list[int] | None = None) -> str"
    assert first_paragraph(f.__doc__) == "Says what f does:\n\n- one\n- two"
    assert first_paragraph(None) == "*(no docstring)*"


def test_a_long_signature_is_written_one_parameter_a_line():
    def g(first_parameter_name: int = 0, second_parameter_name: int = 0, third_parameter_name: int = 0,
          fourth: int = 0):
        """G."""

    assert signature_text("g", g).splitlines() == [
        "g(", "    first_parameter_name: int = 0,", "    second_parameter_name: int = 0,",
        "    third_parameter_name: int = 0,", "    fourth: int = 0,", ")"]
