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


@pytest.mark.parametrize(("args", "message"), [(["--rows", "small,nosuch"], "has no size 'nosuch'"),
                                               (["--device", "cuda"], "fp32 runs on the CPU")])
def test_bench_ops_refuses_an_unknown_size_or_a_device_before_the_output_folder_exists(args, message, tmp_path,
                                                                                      capsys):
    out = tmp_path / "bench"
    assert main(["bench", "ops", *args, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_bench_ops_lines_take_each_ratio_to_its_reference_and_set_it_against_its_goal():
    from benchmarks.ops import lines_of, report_markdown

    counts = {"small": {"single": [2000, 2000], "virtual pipeline, none": [2200, 2200], "MAPL 4x": [2420, 2420],
                        "MAPL 16x + RVQ": [2640, 2981]}}
    lines = {ln["row"]: ln for ln in lines_of(counts)}
    assert lines["single"]["ratio"] is None and lines["single"]["met"] is None
    assert lines["virtual pipeline, none"]["ratio"] == pytest.approx(1.1) and lines["virtual pipeline, none"]["met"]
    assert lines["MAPL 4x"]["ratio"] == pytest.approx(1.1) and lines["MAPL 4x"]["met"] is False
    assert lines["MAPL 16x + RVQ"]["goal"] is None and lines["MAPL 4x"]["blocks_per_stage"] == 2
    assert lines["MAPL 16x + RVQ"]["aten_ops"] == 2810.5 and lines["MAPL 16x + RVQ"]["ratio"] == pytest.approx(1.2775)
    meta = {"date": "d", "git_commit": "c", "versions": {"torch": "t"}, "batch": "4 x 64", "stages": 4}
    md = report_markdown(list(lines.values()), meta)
    assert "| small | 2 | MAPL 4x | 2,420 | 2,420 | 2,420 | 1.100x none | ≤ 1.05x: missed |" in md
    assert "| small | 2 | MAPL 16x + RVQ | 2,640 | 2,981 | 2,810.5 | 1.278x none | – |" in md
    assert "--model.size small" in md
