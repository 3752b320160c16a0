"""The pieces of docs/api.md that need no import (benchmarks/api_doc.py writes the page): a submodule's entry read
from its source with :mod:`ast`, docstring paragraphs, and annotations and values written the same on every machine.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import textwrap
import tokenize
from importlib.machinery import ModuleSpec
from pathlib import Path

# a framework a module may import at its top, and the extra of slimpar that installs it (pyproject.toml)
EXTRAS = {"transformers": "slimpar[hf]", "accelerate": "slimpar[hf]", "lightning": "slimpar[lightning]"}
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_LONGEST_VALUE = 100  # characters of a default or a constant's value; the rest is cut to " ..."
_PLAIN = (str, bytes, int, float, complex, bool, type(None))


def first_paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring, dedented, or a note that there is none."""
    if not doc or not doc.strip():
        return "*(no docstring)*"
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    # a paragraph that announces a list ("...:") reads only with the list that follows it
    end = next((i for i, par in enumerate(paragraphs) if not par.rstrip().endswith(":")), len(paragraphs) - 1)
    return "\n\n".join(paragraphs[:end + 1]).strip()


def format_annotation(annotation: object) -> str:
    """An annotation as the source spells it (``from __future__ import annotations`` keeps it a string), else as
    :func:`inspect.formatannotation` writes a live one."""
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def value_text(value: object) -> str:
    """A default or a constant as its ``repr``, where that reads the same on every machine: plain values and the
    tuples, lists and dicts of them; anything else as ``TypeName(...)`` (no memory address, no hash order)."""
    if _is_plain(value):
        text = repr(value)
    elif inspect.isfunction(value) or inspect.isclass(value):
        text = value.__qualname__
    elif isinstance(value, (set, frozenset)) and all(_is_plain(v) for v in value):
        # a set of strings prints in hash order, which changes from run to run
        items = ", ".join(sorted(repr(v) for v in value))
        text = f"{{{items}}}" if items and type(value) is set else f"{type(value).__name__}({{{items}}})"
        text = text if items else f"{type(value).__name__}()"
    elif type(value) is dict and all(isinstance(k, _PLAIN) for k in value):
        text = "{" + ", ".join(f"{k!r}: {value_text(v)}" for k, v in value.items()) + "}"
    else:
        text = _ADDRESS.sub("", repr(value)) if type(value).__repr__ is not object.__repr__ else ""
        deterministic = text and "0x" not in text and "/" not in text and not dataclasses.is_dataclass(value)
        text = text if deterministic else f"{type(value).__name__}(...)"
    return text if len(text) <= _LONGEST_VALUE else text[:_LONGEST_VALUE] + " ..."


def field_comments(cls: type) -> dict[str, str]:
    """The comment at the end of each annotated field of a class's source (every config field has one): name ->
    comment without its ``#``. Empty where the source cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments = {t.start[0]: t.string.lstrip("#").strip()
                for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT}
    body = ast.parse(source).body[0].body
    return {n.target.id: comments[n.end_lineno] for n in body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.end_lineno in comments}


def _is_plain(value: object, depth: int = 0) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if depth > 3:
        return False
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        return all(_is_plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(_is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in value.items())
    return False


def _defined_names(tree: ast.Module) -> list[str]:
    """A module's ``__all__`` where it writes one as a literal, else its public top-level functions and classes."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:
                break
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and not n.name.startswith("_")]


def _extras(tree: ast.Module) -> list[str]:
    """The extras of slimpar that a module's top-level imports need, in name order."""
    roots = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return sorted({EXTRAS[r] for r in roots if r in EXTRAS})


def module_entry(package: str, name: str, spec: ModuleSpec) -> str:
    """The Markdown of a submodule named in an ``__all__``, read from its source without importing it: a package
    links to its own section; a module gives its docstring's first paragraph, the names it defines and the extra it
    needs."""
    full = f"{package}.{name}"
    tree = ast.parse(Path(spec.origin).read_text())
    summary = first_paragraph(ast.get_docstring(tree))
    if spec.submodule_search_locations is not None:
        return f"### `{full}` · package\n\n{summary}\n\nSee [{full}](#{full.replace('.', '')}).\n"
    parts = [f"### `{full}` · module", summary]
    names = _defined_names(tree)
    if names:
        parts.append("Defines: " + ", ".join(f"`{n}`" for n in names) + ".")
    parts += [f"Needs `{e}` (`pip install {e}`): this page was written without importing it." for e in _extras(tree)]
    return "\n\n".join(parts) + "\n"
