"""An unexpected error (a bug) is one paragraph without a traceback unless --debug or SLIMPAR_DEBUG=1 (issue 22);
an error that a Ctrl-C caused is the interrupt (exit 130)."""

import signal
import threading

import pytest

from slimpar import cli
from slimpar.commands import train as train_command_module


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


def _interrupted_import(*args):
    """What numpy does when Ctrl-C lands inside its import: the KeyboardInterrupt becomes an ImportError."""
    try:
        signal.raise_signal(signal.SIGINT)  # through the handler main() installed
    except KeyboardInterrupt:
        raise ImportError("cannot load module more than once per process") from None


def test_an_error_caused_by_ctrl_c_is_the_interrupt(monkeypatch, capsys):
    """An interrupt that surfaces as another error ends with the interrupt's line and exit 130, not as a bug."""
    monkeypatch.setenv("SLIMPAR_DEBUG", "0")
    monkeypatch.setattr(train_command_module, "CTRL_C", threading.Event())
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda *a: parser)
    for sub in parser._subparsers._group_actions[0].choices.values():
        if sub.prog.endswith(" plan"):
            sub.set_defaults(func=_interrupted_import)
    previous = signal.getsignal(signal.SIGINT)
    try:
        assert cli.main(["plan"]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == ["slimpar: interrupted"]


def test_a_run_interrupted_while_importing_says_where_it_is(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SLIMPAR_DEBUG", "0")
    monkeypatch.setattr(train_command_module, "CTRL_C", threading.Event())
    previous = signal.signal(signal.SIGINT, train_command_module.on_ctrl_c)
    try:
        code = train_command_module.launch_and_report(_interrupted_import, None, tmp_path, "slimpar train --out x")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == [f"slimpar: interrupted; the run folder is {tmp_path}; to resume it: slimpar train --out x"]


def test_without_ctrl_c_the_same_error_is_a_bug(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SLIMPAR_DEBUG", "0")
    monkeypatch.setattr(train_command_module, "CTRL_C", threading.Event())

    def failing_import(*args):
        raise ImportError("cannot load module more than once per process")

    assert train_command_module.launch_and_report(failing_import, None, tmp_path, "again") == 1
    assert "slimpar: internal error: ImportError" in capsys.readouterr().err



def test_a_ctrl_c_that_an_import_hid_stops_the_start_up(monkeypatch, capsys, tmp_path):
    """torch catches the ImportError of an interrupted numpy import and carries on: the start-up stops anyway,
    before the run folder is announced."""
    monkeypatch.setattr(train_command_module, "CTRL_C", threading.Event())
    import slimpar.train.validate.checks as validate_module

    def validate_hiding_ctrl_c(cfg):
        try:
            _interrupted_import()
        except ImportError:
            pass  # as torch does for numpy

    monkeypatch.setattr(validate_module, "validate", validate_hiding_ctrl_c)
    previous = signal.getsignal(signal.SIGINT)
    try:
        assert cli.main(["train", "--config", "llama_tiny", "--out", str(tmp_path / "run")]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    out, err = capsys.readouterr()
    assert "run folder" not in out and not (tmp_path / "run").exists()
    assert [ln for ln in err.splitlines() if ln.strip()] == ["slimpar: interrupted"]
