"""docs/planning.md's Python snippet runs, and the README's and the page's ``plan --fit`` lines parse."""

from __future__ import annotations

import re
import shlex

from slimpar.commands.plan_fit import parse_request
from slimpar.config import load_config
from tests.helpers import ROOT

PAGE = (ROOT / "docs" / "planning.md").read_text()


def test_python_snippet_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLIMPAR_CACHE", str(tmp_path))
    (code,) = re.findall(r"```python\n(.*?)```", PAGE, re.S)
    exec(compile(code, "docs/planning.md", "exec"), {})
    name, step, peak, _ = capsys.readouterr().out.split(" ", 3)
    assert name in ("DDP", "FSDP2") and float(step) > 0 and int(peak) > 0


def _fit_lines(text: str) -> list[list[str]]:
    text = text.replace("\\\n", " ")
    return [shlex.split(line.split("#")[0])[3:] for line in text.splitlines() if line.startswith("slimpar plan --fit")]


def test_command_lines_parse():
    lines = _fit_lines(PAGE) + _fit_lines((ROOT / "README.md").read_text())
    assert len(lines) == 3
    for args in lines:
        config = args[args.index("--config") + 1] if "--config" in args else None
        rest = [a for i, a in enumerate(args) if a != "--config" and (i == 0 or args[i - 1] != "--config")]
        req, run = parse_request([a for a in rest if a != "--json"])
        load_config(config and ROOT / config, run)
        assert req.cluster.preset in ("h100", "this")
