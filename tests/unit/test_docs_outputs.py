"""What a run prints and writes is documented where a user looks (README, docs/outputs.md), with the code's numbers."""

from pathlib import Path

from slimpar.cli_help import config_help
from slimpar.data.text import VAL_FRACTION

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = (ROOT / "docs" / "outputs.md").read_text()
README = (ROOT / "README.md").read_text()


def test_custom_data_validation_split_is_documented():
    tail = f"last {round(VAL_FRACTION * 100)}%"  # the code's fraction, not a number copied into the test
    assert tail in OUTPUTS and 'data.corpus = "path"' in OUTPUTS
    data = README.split("## Data", 1)[1].split("\n## ", 1)[0]
    assert "--data.corpus path" in data and tail in data
    (line,) = [ln for ln in config_help().splitlines() if ln.strip().startswith("--data.path ")]
    assert tail in config_help().split(line, 1)[1].splitlines()[1]  # the field's comment under it in --help


def test_rescale_rows_of_the_summary_are_documented():
    (row,) = [ln for ln in OUTPUTS.splitlines() if "_rescale_survival" in ln and ln.startswith("|")]
    for words in ("`val_*_rescale_none`", "sdp.eval_rescale", "k_c / N", "val loss rescale survival"):
        assert words in row, words


def test_tied_and_boundary_keys_of_a_pipeline_summary_are_documented():
    from slimpar.pipeline.accounting import summarize

    rank = {"steps": 1, "rows": [[0, "fwd", "payload", 8], [1, "bwd", "tied", 4]], "max_orth": 0.0,
            "spel_s": 0.0, "step_s": 1.0, "resyncs": 0}
    prefixes = ("tied_", "boundary_", "compression_ratio_boundary")
    keys = [k for k in summarize([rank], 2, 1, 1, 1) if k.startswith(prefixes)]
    pipeline = (ROOT / "docs" / "pipeline.md").read_text()
    assert len(keys) == 9  # with boundary_fraction_fwd/_bwd
    for stem in ("tied_bytes_per_step_fwd", "boundary_bytes_per_step_fwd", "compression_ratio_boundary"):
        assert stem in OUTPUTS and stem in pipeline and stem in README, stem
    for stem in ("boundary_fraction_fwd", "payload_share_fwd", "pipeline_rank"):  # what compression K became
        assert stem in OUTPUTS and stem in pipeline, stem


def test_membership_record_and_sample_positions_are_documented(tmp_path):
    from slimpar.train.job.elastic import MEMBERSHIP, record_start

    record_start(tmp_path, 4, 0, 0, "job")
    change = record_start(tmp_path, 2, 8, 1, "job")
    kind = OUTPUTS.split("| `kind` | `\"membership\"` |", 1)[1].split("\n\n", 1)[0]  # the kind = membership table
    for key in change:
        assert f"`{key}`" in kind, key
    (row,) = [ln for ln in OUTPUTS.splitlines() if ln.startswith("| `membership` |")]  # summary.json's key
    assert all(f"`{key}`" in row for key in change)
    (files,) = [ln for ln in OUTPUTS.splitlines() if ln.startswith(f"| `{MEMBERSHIP}` |")]
    assert all(f"`{key}`" in files for key in ("world", "step", "restart", "job"))
    assert "| `samples` |" in OUTPUTS and "`log.samples = true`" in OUTPUTS
    elastic = (ROOT / "docs" / "multinode.md").read_text().split("## Elastic runs", 1)[1]
    for words in ("--nnodes 1:2", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "fit_grad_accum", "test_elastic_nodes.py"):
        assert words in elastic, words
