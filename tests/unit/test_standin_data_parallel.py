"""DDP, FSDP2 and every SDP variant on the stand-in accelerator (tests/standin_run.py): each rank's steps with
the guard, clipping and replica checks, the logged loss, evaluation, the export's state dict and the checkpoint's
communication, with every collective refused a host tensor and every host/device mix refused (docs/gpu.md), and no
copy in a step that waits for the device: to the host, or from it without non_blocking (torch synchronises the
stream after one); a CPU run cannot show either.
On 1586a30 each of these modes failed at its first step (the guard's all-reduce, or SDP's clip)."""

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

# one interpreter per group (the imports cost more than a mode); FSDP2's modes alone (tests/standin_run.py)
CHECKSUM = "copy to host at parallel/fingerprint.py:"  # a boundary's checksum: its fingerprint read on the host
GROUPS = [["ddp", "sdp-block", "sdp-block-backward", "sdp-neuron", "sdp-neuron-backward", "sdp-virtual",
           "sdp-virtual-batched"], ["fsdp"], ["sdp-holder-fsdp"], ["sdp-fsdp2"]]


def run_modes(modes: list[str]) -> dict[str, list[dict]]:
    """``python -m tests.standin_run MODE...`` in its own interpreter: each mode's per-rank records."""
    proc = subprocess.run([sys.executable, "-m", "tests.standin_run", *modes], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out: dict[str, list[dict]] = {m: [] for m in modes}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            out[record["mode"]].append(record)
    return out


def check_mode(records: list[dict], world: int, evaluates: str = "every rank") -> None:
    failed = [r for r in records if "error" in r]
    assert not failed, f"rank {failed[0]['rank']}:\n{failed[0]['error']}" if failed else ""
    assert [r["rank"] for r in records] == list(range(world))
    # the stand-in runs checksum every step (tests/standin_run.py: pipeline.checksum_every 1), whose fingerprint
    # goes to the host by design; no other copy in a step may wait for the device
    waits = [(r["rank"], site) for r in records for site in r["copies"]
             if not site.startswith(CHECKSUM)]
    assert not waits, f"copies in a step that wait for the GPU's queue: {waits}"
    assert "val_loss" in records[0]["eval"]
    if evaluates == "rank 0":  # SDP gathers the full model to worker 0 alone
        assert all(r["eval"] == [] for r in records[1:])
    else:
        assert all("val_loss" in r["eval"] for r in records)


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for group in GROUPS:
        out.update(run_modes(group))
    return out


@pytest.mark.parametrize("mode", [m for g in GROUPS for m in g])
def test_mode_on_the_stand_in_accelerator(results, mode):
    from tests.standin_run import config

    real_sdp = mode.startswith("sdp") and "virtual" not in mode
    check_mode(results[mode], config(mode).parallel.workers, "rank 0" if real_sdp else "every rank")
