"""An unexpected error (a bug) is one paragraph without a traceback unless --debug or SLIMPAR_DEBUG=1 (issue 22)."""

import pytest

from slimpar import cli


def _boom(args, rest):
    return 1 // 0


def test_internal_error_is_one_paragraph(monkeypatch, capsys):
    monkeypatch.setenv("SLIMPAR_DEBUG", "0")
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda *a: parser)
    for sub in parser._subparsers._group_actions[0].choices.values():  # route "plan" to the failing function
        if sub.prog.endswith(" plan"):
            sub.set_defaults(func=_boom)
    assert cli.main(["plan"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("slimpar: internal error: ZeroDivisionError: integer division"), err
    assert "tests/unit/test_internal_error.py" not in err and "--debug" in err


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback(monkeypatch, how):
    monkeypatch.setenv("SLIMPAR_DEBUG", "0")  # restored afterwards: main() sets it for --debug
    if how == "env":
        monkeypatch.setenv("SLIMPAR_DEBUG", "1")
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda *a: parser)
    for sub in parser._subparsers._group_actions[0].choices.values():
        if sub.prog.endswith(" plan"):
            sub.set_defaults(func=_boom)
    with pytest.raises(ZeroDivisionError):
        cli.main(["plan", "--debug"] if how == "flag" else ["plan"])
