"""Run configuration: a tree of typed dataclasses (config_sections.py, re-exported here), loaded from TOML and
``--section.key value`` overrides.

This module and the two below it (config_sections.py, codec_defaults.py) are the bottom layers of slimpar and
import nothing else of it, so that models, data and the method libraries can read a section without pulling in
the trainer. Every field carries a comment that is also its ``--help`` text. :func:`load_config` merges
defaults < TOML file < command-line overrides and checks every key and type; the cross-field rules (which need
the models, the data and the SDP planner) live in :mod:`slimpar.train.validate.checks`, whose
``load_run_config`` is what the CLI calls.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import typing
from pathlib import Path
from typing import Any

from slimpar.config_sections import (  # noqa: F401 - the tree's classes are config's public names too
    CheckpointConfig,
    Config,
    DataConfig,
    EvalConfig,
    LogConfig,
    ModelConfig,
    ParallelConfig,
    PipelineConfig,
    RVQConfig,
    SDPConfig,
    TrainConfig,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


CONFIG_DIR = Path(__file__).resolve().parent / "configs"  # the named runs shipped inside the package
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"


class ConfigError(ValueError):
    """A configuration the user must fix; the CLI prints it and exits with code 2."""


def check_choice(where: str, value: str, allowed: tuple[str, ...]) -> None:
    """Raise ConfigError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(f"{where} = {value!r} is not one of: {', '.join(allowed)}")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert a TOML or command-line value to the field's declared type, or raise ConfigError."""
    origin = typing.get_origin(tp)
    if isinstance(value, dict):
        raise ConfigError(f"'{where}' is a value, not a section; give it as {where} = <value>")
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_coerce(v, inner, where) for v in value]
    if isinstance(value, list):
        kind = "true or false" if tp is bool else f"one {getattr(tp, '__name__', tp)}"
        raise ConfigError(f"{where}: expected {kind}, got the list {value!r}; give a single value")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
        try:
            if tp is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            return tp(value) if not isinstance(value, str) else tp(float(value) if tp is float else int(value))
        except (ValueError, TypeError, OverflowError):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}") from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported type {tp}")


def _apply(obj: Any, data: dict[str, Any], prefix: str, unknown: list[str] | None = None) -> None:  # report all
    top, unknown = unknown is None, [] if unknown is None else unknown
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in data.items():
        where = f"{prefix}{key}"
        if key not in names:
            unknown.append(_unknown(where, isinstance(value, dict), names))
            continue
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"'{where}' is a section; give its keys, e.g. --{where}.<key> value")
            _apply(current, value, where + ".", unknown)
        else:
            setattr(obj, key, _coerce(value, hints[key], where))
    if top and unknown:
        raise ConfigError("; ".join(unknown))


def _unknown(where: str, section: bool, names: set[str]) -> str:
    parent, _, key = where.rpartition(".")
    close = [f"did you mean '{parent + '.' if parent else ''}{k}'? " for k in difflib.get_close_matches(key, names, 1)]
    return (f"unknown config key '{where}' ({'a section; ' if section else ''}{''.join(close)}known keys in this "
            f"section: {', '.join(sorted(names))})")


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Turn ``["--train.steps", "10", "--sdp.keep=0.5"]`` into a nested dict of strings."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or "." not in arg:
            raise ConfigError(f"unexpected argument {arg!r}; overrides look like --section.key value")
        if "=" in arg:
            key, value = arg[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ConfigError(f"{arg} needs a value")
            key, value = arg[2:], args[i + 1]
            i += 2
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def packaged_configs() -> list[str]:
    """Names of the runs shipped inside the package (``--config NAME``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def resolve_config_path(path: str | Path) -> Path:
    """A TOML file: ``path`` itself, or a packaged config named ``NAME``, ``NAME.toml`` or ``configs/NAME.toml``.

    The last form keeps the README's commands working outside the repository, where ``configs/`` is absent.
    """
    p = Path(path)
    if p.is_file():
        return p
    if str(p.parent) in (".", "configs"):
        packaged = CONFIG_DIR / (p.name if p.suffix == ".toml" else f"{p.name}.toml")
        if packaged.is_file():
            return packaged
    raise ConfigError(f"config file {str(p)!r} not found; give a TOML file or one of the packaged configs: "
                      f"{', '.join(packaged_configs())}")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults < TOML file < overrides, type-checked (cross-field rules: slimpar.train.validate.checks)."""
    cfg = Config()
    if path is not None:
        p = resolve_config_path(path)
        try:
            data = tomllib.loads(p.read_bytes().decode("utf-8"))
        except OSError as e:
            raise ConfigError(f"cannot read config file {str(p)!r}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}); TOML files are UTF-8: re-save it as UTF-8") \
                from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML ({e}); fix the line it names") from None
        _apply(cfg, data, "")
    _apply(cfg, parse_overrides(overrides or []), "")
    return cfg


def apply_overrides(obj: Any, overrides: list[str]) -> Any:
    """Apply ``--section.key value`` overrides to any tree of dataclasses ``obj`` (in place; returns it), type-checked
    and with unknown keys named, as the run config's are."""
    _apply(obj, parse_overrides(overrides), "")
    return obj


def with_overrides(cfg: Config, overrides: list[str]) -> Config:
    """A copy of ``cfg`` with ``--section.key value`` overrides applied, type-checked as ``load_config``'s."""
    out = from_dict(to_dict(cfg))
    _apply(out, parse_overrides(overrides), "")
    return out


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict's leaves by dotted key: ``{"pipeline": {"rvq": {"levels": 2}}}`` -> ``{"pipeline.rvq.levels": 2}``
    (of :func:`to_dict` or :func:`parse_overrides`)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(dotted(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def from_dict(data: dict[str, Any]) -> Config:
    cfg = Config()
    _apply(cfg, data, "")
    return cfg


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def to_toml(cfg: Config) -> str:
    """Write the resolved config as TOML (sections only contain scalars, lists and subsections)."""
    lines: list[str] = []

    def section(name: str, d: dict[str, Any]) -> None:
        lines.append(f"[{name}]")
        subs = {k: v for k, v in d.items() if isinstance(v, dict)}
        lines.extend(f"{k} = {toml_value(v)}" for k, v in d.items() if not isinstance(v, dict))
        lines.append("")
        for k, v in subs.items():
            section(f"{name}.{k}", v)

    for name, d in to_dict(cfg).items():
        section(name, d)
    return "\n".join(lines)
