"""The placeholders of the generated blocks (benchmarks/readme.py), filled from the committed results files.

A template is Markdown with placeholders that read ``docs/results/SOURCE/results.json`` (or a single run's
``summary.json``):

- ``{{measured:SOURCE}}``: the commit and date the source's rows ran at, and a warning when they ran at more
  than one commit; ``{{commit:SOURCE}}``: the same in a few words, for a table cell;
- ``{{table:SOURCE:WHICH}}``: a table (``readme_tables.TABLES``);
- ``{{v:SOURCE:KEY:FIELD:FORMAT}}``: one number, field ``FIELD`` (dots go into nested records) of the line
  ``KEY`` (``group/row``, or ``row`` where a source has one group), written as ``FORMAT`` (:func:`format_value`);
  ``{{link:SOURCE:KEY:FIELD:FORMAT}}``: the same number as a link to its results file.

Links in templates are written from the repository root; the page that a block lands in rewrites them
relative to itself (benchmarks/readme.py's ``relink``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.report import pm

_PLACEHOLDER = re.compile(r"\{\{(?P<kind>measured|commit|table|v|link):(?P<args>[^}]*)\}\}")


class ReadmeError(ValueError):
    """A template names a source, line, field or format that does not exist."""


@dataclass
class Source:
    """One results file: its lines by key, the commits its rows ran at, and the date it was written."""

    name: str
    lines: dict[str, dict]
    commits: list[str]
    date: str
    data: dict

    def line(self, key: str) -> dict:
        if key not in self.lines:
            raise ReadmeError(f"docs/results/{self.name}/results.json has no line {key!r}; "
                              f"it has {sorted(self.lines)}")
        return self.lines[key]


def _keyed(lines: list[dict], key: Callable[[dict], str]) -> dict[str, dict]:
    return {key(ln): ln for ln in lines}


def _group_row(ln: dict) -> str:
    return f"{ln['group']}/{ln['row']}"


def load_source(name: str, results: Path) -> Source:
    """Read ``results/NAME/results.json`` into a :class:`Source`."""
    from benchmarks.report import run_commits

    path = results / name / "results.json"
    if not path.exists() and (results / name / "summary.json").exists():  # one run's summary.json
        summary = json.loads((results / name / "summary.json").read_text())
        return Source(name, {"run": summary}, [summary["git_commit"]], summary["measured"], summary)
    if not path.exists():
        raise ReadmeError(f"{path} does not exist: run the benchmark that writes it (see docs/readme)")
    data = json.loads(path.read_text())
    if name == "memory":  # slimpar bench memory: predictions, one commit
        lines = _keyed(data["rows"], lambda r: f"{r['size']}/{r['mode']}")
        for ln in lines.values():  # the worst worker's peak against DDP's at the same size
            ln["vs_ddp"] = ln["worst"]["peak_live"] / lines[f"{ln['size']}/DDP"]["worst"]["peak_live"]
        return Source(name, lines, [data["commit"]], data["date"], data)
    if name == "wallclock":
        lines = _keyed(data["lines"], lambda r: f"{r['row']}@{r['rate_mbit']:g}")
        for ln in lines.values():  # step time against the family's reference at the same rate
            ref = lines.get(f"{'DDP' if ln['family'] == 'sdp' else 'none'}@{ln['rate_mbit']:g}")
            ln["vs_reference"] = ln["step_time_s"] / ref["step_time_s"] if ref else None
        lines.update({f"fit/{row}": fit for row, fit in data["fits"].items()})
        return Source(name, lines, [data["meta"]["git_commit"]], data["meta"]["date"], data)
    if name == "fit":  # slimpar bench fit: predictions against runs, one commit
        lines = _keyed(data["lines"], lambda r: f"{r['row']}@{r['rate_mbit']:g}")
        return Source(name, lines, [data["meta"]["git_commit"]], data["meta"]["date"], data)
    runs = data.get("runs", []) + data.get("timing_runs", [])
    commits = run_commits(runs) or [data["meta"]["git_commit"]]
    lines = _keyed(data["lines"], _group_row)
    if len({ln["group"] for ln in data["lines"]}) == 1:  # one group: rows are also known by name alone
        lines.update(_keyed(data["lines"], lambda ln: ln["row"]))
    return Source(name, lines, commits, data["meta"]["date"], data)


def results_file(src: Source) -> str:
    """The file a source was read from, from the repository root."""
    return f"docs/results/{src.name}/{'summary.json' if 'run' in src.lines else 'results.json'}"


def measured_line(src: Source) -> str:
    """'Measured at commit `abc1234`, 2026-12-02 ([results](docs/results/x/results.json)).' (+ mixed warning)."""
    link = f"[docs/results/{src.name}]({results_file(src)})"
    if len(src.commits) == 1:
        return f"*Measured at commit `{src.commits[0][:7]}`, {src.date[:10]} ({link}).*"
    names = ", ".join(f"`{c[:7]}`" for c in src.commits)
    return (f"*Written {src.date[:10]} from runs at {len(src.commits)} different commits ({names}; {link}): "
            "rows measured at different commits may differ by the changes between them.*")


def commit_cell(src: Source) -> str:
    """'`abc1234`, 2026-12-02', or '2026-12-03 (11 commits)': the measured line in a table cell."""
    if len(src.commits) == 1:
        return f"`{src.commits[0][:7]}`, {src.date[:10]}"
    return f"{src.date[:10]} ({len(src.commits)} commits)"


# FORMAT = a kind and a number of decimals: f2 -> 0.60, pct1 -> +9.6% (a fraction), chg0 -> -40% (a ratio
# minus one), pm3 -> 3.570 ± 0.026 and pmpct1 -> +9.6% ± 0.7 (FIELD and FIELD_std: mean ± std over seeds);
# mib, mb (10^6 bytes, 2 decimals), gb and int take no decimals
FORMATS = ("f", "pct", "chg", "pm", "pmpct", "mib", "mb", "gb", "int")
_FORMAT = re.compile(r"(?P<kind>[a-z]+?)(?P<digits>[0-4]?)")


def format_value(ln: dict, field: str, spec: str) -> str:
    """One number of line ``ln`` as ``spec`` says (see FORMATS)."""
    m = _FORMAT.fullmatch(spec)
    if not m or m["kind"] not in FORMATS or (m["kind"] in ("mib", "mb", "gb", "int")) == bool(m["digits"]):
        raise ReadmeError(f"format {spec!r}: one of f/pct/chg/pm/pmpct followed by 0-4 decimals, or mib, mb, gb, int")
    kind, d = m["kind"], int(m["digits"] or 0)
    if kind in ("pm", "pmpct"):
        return pm(ln.get(field), ln.get(f"{field}_std"), d, kind == "pmpct")
    v = _get(ln, field)
    return {"f": lambda: f"{v:.{d}f}", "pct": lambda: f"{100 * v:+.{d}f}%", "chg": lambda: f"{100 * (v - 1):+.{d}f}%",
            "mib": lambda: f"{v / 2**20:.1f} MiB", "mb": lambda: f"{v / 1e6:.2f} MB", "gb": lambda: f"{v / 1e9:.1f} GB",
            "int": lambda: f"{round(v):,}"}[kind]()


def _get(ln: dict, field: str):
    value = ln
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ReadmeError(f"no field {field!r} in line {ln.get('row', ln.get('mode', '?'))!r}")
        value = value[part]
    if value is None:
        raise ReadmeError(f"field {field!r} of line {ln.get('row', '?')!r} is empty in the results")
    return value


def render(template: str, sources: dict[str, Source]) -> str:
    """Fill one template's placeholders from ``sources``."""
    from benchmarks.readme_tables import TABLES

    def one(m: re.Match) -> str:
        kind, args = m["kind"], m["args"].split(":")
        src = sources.get(args[0])
        if src is None:
            raise ReadmeError(f"unknown results source {args[0]!r} in {m[0]}; known: {sorted(sources)}")
        if kind == "measured":
            return measured_line(src)
        if kind == "commit":
            return commit_cell(src)
        if kind == "table":
            table = TABLES.get(f"{args[0]}:{args[1]}") if len(args) == 2 else None
            if table is None:
                raise ReadmeError(f"unknown table {m[0]}; known: {sorted(TABLES)}")
            return table(src)
        if len(args) != 4:
            raise ReadmeError(f"{m[0]}: write {{{{{kind}:SOURCE:KEY:FIELD:FORMAT}}}}")
        value = format_value(src.line(args[1]), args[2], args[3])
        return f"[{value}]({results_file(src)})" if kind == "link" else value

    return _PLACEHOLDER.sub(one, template)


