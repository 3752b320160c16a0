"""The README's MAPL example states what its committed run measured (docs/results/readme_mapl_example)."""

import json
import re

from tests.helpers import ROOT


def test_readme_mapl_example_figures_match_the_committed_run():
    s = json.loads((ROOT / "docs/results/readme_mapl_example/summary.json").read_text())
    text = (ROOT / "README.md").read_text().split("## Compressed pipeline parallelism (MAPL)", 1)[1].split("\n## ")[0]
    text = " ".join(text.split())
    assert s["git_commit"][:7] in text
    mb = lambda key: f"{s[key] / 1e6:.2f} MB"  # noqa: E731
    expect = [f"{mb('boundary_bytes_per_step_fwd')} forward and {mb('boundary_bytes_per_step_bwd')} backward",
              f"against {mb('comm_bytes_per_step_none')} uncompressed",
              f"**{s['compression_ratio_boundary']:.2f}x** for the boundaries",
              f"adds {mb('tied_bytes_per_step_fwd')} forward", f"and {mb('tied_bytes_per_step_bwd')} backward",
              f"**total is {s['compression_ratio']:.2f}x** (backward alone {s['compression_ratio_bwd']:.2f}x)"]
    for phrase in expect:
        assert phrase in text, (phrase, re.findall(r"\d\.\d\dx|\d\.\d\d MB", text))
