"""The method libraries load without the trainer, the benchmarks or the CLI (docs/architecture.md)."""

import json
import subprocess
import sys

PROBE = """
import json, sys
import slimpar.sdp, slimpar.pipeline, slimpar.codecs, slimpar.optim, slimpar.models
slimpar.pipeline.CodecPipelineStage  # imported on first use (slimpar/pipeline/__init__.py)
from slimpar import SubnetworkDataParallel  # the top-level API, imported on first use (slimpar/__init__.py)
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("slimpar", "benchmarks")))))
"""


def test_libraries_import_without_the_trainer():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "slimpar.sdp.wrapper" in loaded and "slimpar.pipeline.stage" in loaded  # the probe did import them
    upper = [m for m in loaded if m.split(".")[1:2] in (["train"], ["cli"]) or m.split(".")[0] == "benchmarks"]
    assert upper == [], f"library imports pulled in {upper}"


def test_no_import_cycles():
    """No group of slimpar modules imports itself round in a circle (deferred imports inside functions count)."""
    import grimp  # installed with import-linter

    graph = grimp.build_graph("slimpar", cache_dir=None)
    cycles = [_cycle_through(graph, m) for m in sorted(graph.modules)]
    assert [c for c in cycles if c] == []


def _cycle_through(graph, module: str) -> list[str]:
    """A chain of imports leading from ``module`` back to itself, or [] (breadth-first over direct imports)."""
    parents, frontier = {}, [module]
    while frontier:
        nxt = []
        for m in frontier:
            for d in sorted(graph.find_modules_directly_imported_by(m)):
                if d == module:
                    chain = [m]
                    while chain[-1] != module:
                        chain.append(parents[chain[-1]])
                    return [module, *reversed(chain[:-1]), module] if len(chain) > 1 else [module, m, module]
                if d not in parents:
                    parents[d] = m
                    nxt.append(d)
        frontier = nxt
    return []
