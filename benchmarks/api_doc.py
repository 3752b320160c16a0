"""docs/api.md, written from the docstrings: every name a library package of slimpar exports (its ``__all__``), with
its kind, its signature and the first paragraph of its docstring.

    python -m benchmarks.api_doc            # write docs/api.md
    python -m benchmarks.api_doc --check    # compare, write nothing; exit 1 if the page is out of date

Like the measured blocks of ``slimpar bench readme`` (benchmarks/readme.py), the page is never typed by hand:
``tests/unit/test_api_doc.py`` regenerates it in memory and compares it with the committed page. The libraries are
imported; a submodule named in an ``__all__`` is read from its source instead (:mod:`benchmarks.api_source`), so the
integrations that need an optional framework (``slimpar[hf]``, ``slimpar[lightning]``) are documented without it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import inspect
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

from benchmarks.api_source import field_comments, first_paragraph, format_annotation, module_entry, value_text

ROOT = Path(__file__).resolve().parents[1]
PAGE = "docs/api.md"
COMMAND = "python -m benchmarks.api_doc"
_UNBOUND = object()
_WIDEST_LINE = 100  # a longer signature is written one parameter a line
# the packages behind ``slimpar train`` and the other commands: the application, not a library a user imports
APPLICATION = ("slimpar.commands", "slimpar.train")
_INTRO = f"""# API reference

<!-- written by `{COMMAND}` from the docstrings: edit the docstrings, not this page -->

What each library package of slimpar exports (its `__all__`): every name with its kind, its signature (a class's
constructor; a dataclass's fields, with the comment beside each in the source) and the first paragraph of its
docstring. A submodule is listed with the first paragraph of its docstring and the names it defines; open it for the
rest. The trainer (`slimpar.train`) and the commands (`slimpar.commands`) are the application behind `slimpar train`,
`slimpar eval` and the other commands, not libraries, so they are not listed here; [architecture.md](architecture.md)
places every package in its layer.
"""


def library_packages() -> list[str]:
    """``slimpar`` and every package under it outside :data:`APPLICATION`, top-level ones only, in name order."""
    found = sorted(p.parent.name for p in (ROOT / "slimpar").glob("*/__init__.py"))
    return ["slimpar", *(f"slimpar.{n}" for n in found if f"slimpar.{n}" not in APPLICATION)]


def signature_text(name: str, obj: object) -> str | None:
    """``name(params) -> return`` for a function or a class (its constructor), or None where Python has none.
    Annotations are written as the source spells them, defaults as their ``repr`` without memory addresses."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = []
    kinds = [p.kind for p in sig.parameters.values()]
    for i, p in enumerate(sig.parameters.values()):
        if p.kind is p.KEYWORD_ONLY and p.VAR_POSITIONAL not in kinds and p.KEYWORD_ONLY not in kinds[:i]:
            params.append("*")
        params.append(_parameter(p))
        if p.kind is p.POSITIONAL_ONLY and p.POSITIONAL_ONLY not in kinds[i + 1:]:
            params.append("/")
    returns = ""
    if sig.return_annotation is not sig.empty and not inspect.isclass(obj):
        returns = f" -> {format_annotation(sig.return_annotation)}"
    text = f"{name}({', '.join(params)}){returns}"
    if len(text) <= _WIDEST_LINE:
        return text
    return f"{name}(\n" + "".join(f"    {p},\n" for p in params) + f"){returns}"


def _parameter(p: inspect.Parameter) -> str:
    prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
    text = prefix + p.name
    if p.annotation is not p.empty:
        text += f": {format_annotation(p.annotation)}"
    if p.default is not p.empty:
        text += (" = " if p.annotation is not p.empty else "=") + value_text(p.default)
    return text


def dataclass_text(name: str, cls: type) -> str:
    """A dataclass as its decorator and one line per field: ``name: type = default  # comment`` (a factory as
    ``factory()``, the comment the source writes beside the field)."""
    frozen = cls.__dataclass_params__.frozen
    lines = ["@dataclass(frozen=True)" if frozen else "@dataclass", f"class {name}:"]
    comments = field_comments(cls)
    for f in dataclasses.fields(cls):
        line = f"    {f.name}: {format_annotation(f.type)}"
        if f.default is not dataclasses.MISSING:
            line += f" = {value_text(f.default)}"
        elif f.default_factory is not dataclasses.MISSING:
            line += f" = {getattr(f.default_factory, '__qualname__', type(f.default_factory).__name__)}()"
        lines.append(f"{line}  # {comments[f.name]}" if f.name in comments else line)
    return "\n".join(lines)


def _own_doc(obj: object) -> str | None:
    """The docstring written on ``obj`` itself: not a base class's, nor the one ``@dataclass`` makes up."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and doc and doc.startswith(f"{obj.__name__}("):
        return None
    return doc


def object_entry(package: str, name: str, obj: object) -> str:
    """The Markdown of one exported name that is not a module: heading, signature block, summary."""
    if inspect.isclass(obj):
        kind = "dataclass" if dataclasses.is_dataclass(obj) else "class"
        code = dataclass_text(name, obj) if kind == "dataclass" else signature_text(name, obj)
        # an exception, or a class Python gives no signature: its bases say what it is
        code = code or f"class {name}({', '.join(b.__qualname__ for b in obj.__bases__)})"
        doc = _own_doc(obj)
    elif callable(obj):
        kind, code, doc = "function", signature_text(name, obj), _own_doc(obj)
    else:
        kind, code, doc = "constant", f"{name}: {type(obj).__name__} = {value_text(obj)}", None
    parts = [f"### `{package}.{name}` · {kind}"]
    if code:
        parts.append(f"```python\n{code}\n```")
    if kind != "constant":
        parts.append(first_paragraph(doc))
    return "\n\n".join(parts) + "\n"


def package_section(package: str) -> str:
    """The section of one package: its summary, then every name of its ``__all__`` in the order it gives them."""
    module = importlib.import_module(package)
    parts = [f"## {package}\n\n{first_paragraph(module.__doc__)}\n"]
    for name in module.__all__:
        spec = _submodule_spec(module, name)
        parts.append(module_entry(package, name, spec) if spec else object_entry(package, name, getattr(module, name)))
    return "\n".join(parts)


def _submodule_spec(module: ModuleType, name: str) -> ModuleSpec | None:
    """The spec of ``module.name`` where that name of ``__all__`` is a submodule (read from its source, never
    imported here), else None: an object, or one the package's ``__getattr__`` imports on first use."""
    bound = module.__dict__.get(name, _UNBOUND)
    if bound is _UNBOUND or (isinstance(bound, ModuleType) and bound.__name__ == f"{module.__name__}.{name}"):
        return importlib.util.find_spec(f"{module.__name__}.{name}")
    return None


def generate() -> str:
    """The whole page, the same on every machine: no addresses, no paths, the order of each ``__all__``."""
    packages = library_packages()
    contents = "".join(f"- [{p}](#{p.replace('.', '')})\n" for p in packages)
    page = "\n".join([_INTRO, contents, *(package_section(p) for p in packages)]).rstrip("\n") + "\n"
    for leak in (str(ROOT), " object at 0x"):
        if leak in page:  # a docstring or a default that would make the page differ between machines
            raise ValueError(f"{PAGE} would contain {leak!r}: change the docstring or the default that writes it")
    return page


def api_doc_command(check: bool, root: Path = ROOT) -> int:
    """Write ``docs/api.md`` under ``root``, or with ``check`` compare it and say how to bring it up to date."""
    path = root / PAGE
    new = generate()
    if not check:
        path.write_text(new)
        print(f"wrote {PAGE}")
        return 0
    if path.exists() and path.read_text() == new:
        print(f"{PAGE} is up to date")
        return 0
    print(f"{PAGE} differs from the docstrings: run `{COMMAND}` and commit the page")
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare docs/api.md, write nothing; exit 1 if it differs")
    return api_doc_command(parser.parse_args(argv).check)


if __name__ == "__main__":
    sys.exit(main())
