"""The GPU memory probe runs on CPU with the tracker, and subnetworks hold less than the full model."""

import torch

from benchmarks.gpu import ROWS, probe_row


def test_probe_orders_rows_by_memory():
    res = {name: probe_row("tiny", row, torch.device("cpu"), batch=2, seq=32, workers=4, steps=2, vocab=512)
           for name, row in ROWS.items()}
    full = res["DDP (full model)"]
    assert res["B-SDP 0.5"]["params_bytes"] < full["params_bytes"]
    assert res["B-SDP 0.5"]["tracker_peak_bytes"] < full["tracker_peak_bytes"]
    assert res["Bb-SDP 0.5"]["params_bytes"] == full["params_bytes"]  # full forward: all parameters stay
    assert res["Bb-SDP 0.5"]["optimizer_bytes"] < full["optimizer_bytes"]
