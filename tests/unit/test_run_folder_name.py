"""A run without --out is named after what it trains: the config and, for the user's own data, the data file."""

import pytest

from slimpar.cli import main


@pytest.fixture
def launched(tmp_path, monkeypatch):
    """The run folder ``slimpar train`` would launch in (nothing is trained)."""
    import slimpar.train.launch.launcher as launch

    folders = []
    monkeypatch.setattr(launch, "launch", lambda cfg, out: folders.append(out))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mytext.txt").write_text("To be, or not to be, that is the question.\n" * 200)
    return folders


@pytest.mark.parametrize("args, name", [
    ([], "mytext"),  # the embedded default config: not "default"
    (["--config", "llama_tiny"], "llama_tiny-mytext"),
])
def test_custom_data_run_is_named_after_its_file(launched, args, name):
    assert main(["train", *args, "--data.corpus", "path", "--data.path", "mytext.txt", "--data.ood", "none"]) == 0
    (out,) = launched
    assert out.parent.name == "runs" and out.name == name, out  # no time stamp: a re-run finds it


def test_shakespeare_run_keeps_the_config_name(launched):
    assert main(["train", "--config", "llama_tiny", "--data.ood", "none"]) == 0
    (out,) = launched
    assert out.name == "llama_tiny"
