"""slimpar's public surface: every package says what it exports (``__all__``), every exported name is there, the
libraries are reachable from a plain ``import slimpar``, and that import stays lazy (no torch for ``--version``)."""

import importlib
import importlib.util
import subprocess
import sys

import pytest

from tests.helpers import ROOT

# every package under slimpar/, found on disk so that a new one cannot be left out
PACKAGES = sorted(".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "slimpar").rglob("__init__.py")
                  if "__pycache__" not in p.parts)


def test_the_package_list_is_found():
    assert {"slimpar", "slimpar.sdp", "slimpar.pipeline", "slimpar.integrations", "slimpar.train.strategies"} \
        <= set(PACKAGES)


@pytest.mark.parametrize("name", PACKAGES)
def test_every_package_declares_its_public_names(name):
    module = importlib.import_module(name)
    public = getattr(module, "__all__", None)
    assert isinstance(public, list) and public, f"{name} declares no __all__"
    assert len(set(public)) == len(public), f"{name}.__all__ repeats a name"
    for item in public:
        # a submodule counts as found without importing it: some need an optional extra (slimpar[hf]), and
        # importing one here would only repeat what its own tests do
        if importlib.util.find_spec(f"{name}.{item}") is not None:
            continue
        assert hasattr(module, item), f"{name}.__all__ names {item!r}, which {name} does not have"


def test_the_libraries_are_reachable_from_import_slimpar():
    script = ("import slimpar; assert slimpar.pipeline.CodecSpec and slimpar.sdp.plan_blocks; "
              "assert slimpar.integrations.__name__ == 'slimpar.integrations'; "
              "assert slimpar.hybrid.StageSDP and slimpar.SubnetworkDataParallel; print('ok')")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.stdout.strip() == "ok", proc.stderr


def test_import_slimpar_and_version_do_not_import_torch():
    """The lazy ``__getattr__`` of slimpar/__init__.py is what keeps ``slimpar --version`` fast: a top-level import
    of any library there would load torch (seconds) before the command line even parses its arguments."""
    script = ("import sys; import slimpar; assert 'torch' not in sys.modules, 'import slimpar'; "
              "from slimpar.cli import main\n"
              "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
              "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.stdout.split()[-1:] == ["False"], (proc.stdout, proc.stderr)


def test_unknown_names_still_raise():
    import slimpar

    with pytest.raises(AttributeError):
        slimpar.no_such_part  # noqa: B018
