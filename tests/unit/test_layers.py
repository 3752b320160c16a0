"""The method libraries load without the trainer, the benchmarks or the CLI (docs/architecture.md)."""

import json
import subprocess
import sys

PROBE = """
import json, sys
import slimpar.sdp, slimpar.pipeline, slimpar.codecs, slimpar.optim, slimpar.models
print(json.dumps(sorted(m for m in sys.modules if m.startswith("slimpar"))))
"""


def test_libraries_import_without_the_trainer():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "slimpar.sdp.wrapper" in loaded and "slimpar.pipeline.stage" in loaded  # the probe did import them
    upper = [m for m in loaded if m.split(".")[1:2] in (["train"], ["bench"], ["cli"])]
    assert upper == [], f"library imports pulled in {upper}"
