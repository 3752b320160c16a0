"""``--help`` text for the config tree: every field with the value that runs and its comment.

Apart from :mod:`slimpar.config` so that the config module stays the small typed tree it is; only the CLI
shows this text.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from slimpar.config import Config, packaged_configs, toml_value


def field_docs(cls: type = Config, prefix: str = "", values: Any = None) -> list[tuple[str, str, str, str]]:
    """Every leaf field as ``(--section.key, type, default, comment)``, read from the dataclasses' source;
    the defaults are ``values``' (a loaded config: what runs) or, without it, the dataclasses' own.

    The comments after each field are the documentation, so ``--help`` can never drift from the code.
    """
    import inspect

    comments: dict[str, str] = {}
    for line in inspect.getsource(cls).splitlines():
        name, sep, rest = line.strip().partition(":")
        if sep and "#" in rest and name.isidentifier():
            comments[name] = rest.split("#", 1)[1].strip()
    hints, out, default = typing.get_type_hints(cls), [], cls() if values is None else values
    for f in dataclasses.fields(cls):
        value = getattr(default, f.name)
        if dataclasses.is_dataclass(value):
            out += field_docs(type(value), f"{prefix}{f.name}.", value)
            continue
        tp = hints[f.name]
        type_name = getattr(tp, "__name__", str(tp)) if typing.get_origin(tp) is not list else "list"
        out.append((f"--{prefix}{f.name}", type_name, toml_value(value), comments.get(f.name, "")))
    return out


def config_help(cfg: Config | None = None, source: str = "") -> str:
    """The ``--help`` epilog of commands that take a config: every field, its type, default and meaning;
    the defaults shown are ``cfg``'s, the config loaded from ``source`` (what a run without overrides runs)."""
    lines = [f"config fields, with the values of {source or 'the dataclasses'} (override any with --section.key "
             "VALUE; lists as a,b,c):"]
    section = None
    for key, tp, default, comment in field_docs(values=cfg):
        head = key[2:].split(".")[0]
        if head != section:
            section = head
            lines.append(f"\n  [{section}]")
        lines.append(f"  {key} {tp.upper()} = {default}\n      {comment}")
    names = ", ".join(packaged_configs())
    lines.append(f"\npackaged configs (--config NAME): {names}")
    return "\n".join(lines)
