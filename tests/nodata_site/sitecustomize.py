"""A machine without slimpar's data (tests/unit/test_predict_without_data.py): with this folder on PYTHONPATH, each
package named in ``SLIMPAR_TEST_BLOCK`` (comma-separated) is unimportable, as if it were not installed.

``sys.modules[name] = None`` makes ``import name`` (and its submodules) raise ModuleNotFoundError and
``importlib.util.find_spec(name)`` return None, the two ways slimpar looks for a package; the files stay where
they are, so a test can block them in its subprocesses without touching the installed environment."""

import os
import sys

for _name in filter(None, os.environ.get("SLIMPAR_TEST_BLOCK", "").split(",")):
    sys.modules[_name] = None
