"""``--rows`` of every benchmark: an unknown name is one clear error (exit 2) before anything is written."""

import pytest

from benchmarks.network.wallclock import bench_wallclock
from slimpar.cli import main
from slimpar.config import ConfigError


@pytest.mark.parametrize(("which", "known"), [("quality", "DDP"), ("sdp", "llama/DDP"), ("mapl", "none")])
def test_an_unknown_row_is_refused_before_the_output_folder_exists(which, known, tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", which, "--rows", f"{known},nosuch", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark rows ['nosuch']" in err and "groups: [" in err
    assert not out.exists()


def test_an_unknown_wallclock_row_is_refused_before_the_output_folder_exists(tmp_path):
    out = tmp_path / "bench"
    with pytest.raises(ConfigError, match=r"unknown wallclock rows \['nosuch'\]"):
        bench_wallclock(out, quick=True, only={"nosuch"})
    assert not out.exists()
