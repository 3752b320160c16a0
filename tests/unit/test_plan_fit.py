"""``slimpar plan --fit``'s parts against hand computations: the cluster, the ring traffic model, the flow-line
step time, the quality evidence (equal to what the committed results give), and the command's errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from slimpar.config import ConfigError, load_config, with_overrides
from slimpar.plan.cluster import GIB, PRESETS, ClusterConfig, parse_size, resolve_cluster
from slimpar.plan.evidence import build_evidence, load_evidence, predict_gap
from slimpar.plan.shape import shape_of
from slimpar.plan.steptime import _flow, step_seconds
from slimpar.plan.workload import workload
from tests.helpers import ROOT, TINY


def _cluster(**kw):
    base = dict(preset="h100", nodes=2, gpus_per_node=2, inter_gbps=1.0, intra_gbps=100.0, mfu=0.5)
    return resolve_cluster(ClusterConfig(**{**base, **kw}))


def _cfg(*overrides):
    return with_overrides(load_config(TINY), ["--parallel.workers", "4", *overrides])


def test_presets_and_explicit_fields():
    c = resolve_cluster(ClusterConfig(preset="a100-80gb", nodes=3))
    assert (c.workers, c.tflops, c.gpu_memory, c.intra_gbps) == (24, 312.0, PRESETS["a100-80gb"].memory, 2400.0)
    assert any("assumed" in n for n in c.notes)  # no measured MFU: the assumption is stated
    c = resolve_cluster(ClusterConfig(preset="l4", gpus_per_node=4, gpu_memory="20GiB", tflops=100, mfu=0.4))
    assert (c.gpus_per_node, c.gpu_memory, c.tflops, c.mfu) == (4, 20 * GIB, 100.0, 0.4)
    assert c.flops_per_s == pytest.approx(40e12)
    assert [c.node_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert parse_size("24GB", "x") == 24_000_000_000 and parse_size("512MiB", "x") == 512 << 20


@pytest.mark.parametrize("field, value, words", [
    ("nodes", 0, "cluster.nodes"), ("preset", "h800", "cluster.preset"), ("mfu", 1.5, "cluster.mfu"),
    ("inter_gbps", 0.0, "cluster.inter_gbps"), ("gpu_memory", "lots", "cluster.gpu_memory"),
    ("tflops", -1.0, "cluster.tflops")])
def test_bad_cluster_names_the_field(field, value, words):
    kw = {"nodes": 2, field: value}
    with pytest.raises(ConfigError, match=words):
        resolve_cluster(ClusterConfig(**kw))


def test_ddp_ring_bytes_by_hand():
    """4 ranks on 2 nodes, ring 0-1-2-3-0: every edge carries 2 (k - 1) / k of the gradient bytes; the edges
    1 -> 2 and 3 -> 0 leave a node, one per node."""
    cfg = _cfg("--parallel.mode", "ddp")
    w = workload(cfg, _cluster())
    grads = shape_of(cfg).params * 4
    edge = 2 * 3 / 4 * grads
    assert w.traffic.overlap.inter == {0: pytest.approx(edge), 1: pytest.approx(edge)}
    assert w.traffic.overlap.intra == {0: pytest.approx(edge), 2: pytest.approx(edge)}
    assert w.traffic.total.inter_max == pytest.approx(edge)


def test_fsdp_gathers_twice_and_scatters_once():
    """bf16 parameters gathered in forward, the blocks' again in backward (the root stays), fp32 gradients."""
    cfg = _cfg("--parallel.mode", "fsdp", "--train.dtype", "bf16")
    t = workload(cfg, _cluster()).traffic
    s = shape_of(cfg)
    blocks = s.layers * s.block_params
    assert t.gather.inter_max == pytest.approx(3 / 4 * s.params * 2)
    assert t.overlap.inter_max == pytest.approx(3 / 4 * (blocks * 2 + s.params * 4))
    assert t.total.inter_max == pytest.approx(3 / 4 * (s.params * 2 + blocks * 2 + s.params * 4))


def test_pipeline_boundary_crosses_between_nodes():
    """4 stages on 2 nodes: boundary 1 -> 2 crosses, with the codec's exact steady-state bytes each way."""
    from slimpar.pipeline.budget import steady_bytes
    from slimpar.train.strategies.pipeline_specs import codec_specs, step_shape

    cfg = _cfg("--parallel.mode", "pipeline", "--pipeline.stages", "4", "--pipeline.codec", "mapl",
               "--model.tie_embeddings", "false")
    cl = _cluster()
    w = workload(cfg, cl)
    s = shape_of(cfg)
    sent = steady_bytes(codec_specs(cfg, s.dim, s.vocab)[1], step_shape(cfg))
    assert [b.gbps for b in w.traffic.boundaries] == [100.0, 1.0, 100.0]
    assert w.traffic.total.inter == {0: pytest.approx(sent["fwd"]), 1: pytest.approx(sent["bwd"])}


def test_flow_line_is_the_pipeline_formula():
    """Uniform stages c and free links: (M + P - 1) x c, GPipe's and 1F1B's step."""
    assert _flow([2.0] * 4, [0.0] * 3, 8) == pytest.approx((8 + 4 - 1) * 2.0)
    assert _flow([1.0, 1.0], [3.0], 5) == pytest.approx(1 + 1 + 3 + 4 * 3.0)  # a slow link is the bottleneck


def test_ddp_step_overlaps_the_sync_with_backward():
    cfg = _cfg("--parallel.mode", "ddp")
    cl = _cluster(inter_gbps=1e6, intra_gbps=1e6, mfu=1e-6)  # links ~free, slow compute: the step is compute
    t = step_seconds(workload(cfg, cl), cl, False)
    assert t["step"] == pytest.approx(t["compute"], rel=1e-3)
    flops = shape_of(cfg).flops_per_token * cfg.train.batch_size * cfg.data.seq_len / 4
    assert t["compute"] == pytest.approx(flops / cl.flops_per_s)
    slow = _cluster(inter_gbps=1e-3)
    t = step_seconds(workload(cfg, slow), slow, False)
    sync = workload(cfg, slow).traffic.overlap.inter_max * 8 / 1e6
    assert t["step"] >= sync and t["comm"] > 0.9 * sync  # bandwidth-bound: the sync is the step


def test_committed_evidence_equals_the_results_files():
    assert load_evidence() == json.loads(json.dumps(build_evidence(ROOT / "docs" / "results")))


def test_gap_interpolates_in_log_tokens():
    ev = {"m": [{"tokens_per_param": 1.0, "gap": 0.04, "gap_std": 0.01, "ood_gap": 0.05, "row": "a"},
                {"tokens_per_param": 4.0, "gap": 0.02, "gap_std": 0.005, "ood_gap": 0.03, "row": "b"}]}
    g = predict_gap("m", 2.0, ev)  # halfway in log
    assert (g.gap, g.std, g.ood_gap) == (pytest.approx(0.03), pytest.approx(0.0075), pytest.approx(0.04))
    assert predict_gap("m", 8.0, ev).gap is None and "no evidence" in predict_gap("m", 8.0, ev).note
    assert predict_gap("exact", 100.0, ev).gap == 0.0
    assert predict_gap("hybrid", 1.0, ev).note == "no evidence"
    assert math.isclose(predict_gap("m", 4.0, ev).gap, 0.02)


def _plan_fit(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {"SLIMPAR_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}
    import os

    env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "slimpar", "plan", "--fit", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


@pytest.mark.parametrize("args, words", [
    (["--cluster.nodes", "0"], "cluster.nodes"), (["--cluster.nodez", "2"], "cluster.nodes"),
    (["--cluster.inter_gbps", "fast"], "cluster.inter_gbps"), (["--fit.objective", "cost"], "fit.objective"),
    (["--cluster.preset", "tpu"], "cluster.preset")])
def test_cli_bad_input_exits_2_naming_the_field(args, words, tmp_path):
    proc = _plan_fit("--config", "llama_tiny", *args, tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing written


def test_cli_json_ranks_by_memory(tmp_path):
    proc = _plan_fit("--config", "llama_tiny", "--cluster.nodes", "2", "--cluster.gpus_per_node", "2",
                     "--fit.candidates", "DDP,B-SDP 1/2", "--fit.objective", "memory", "--json", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    rows = out["candidates"]
    assert {r["name"] for r in rows} == {"DDP", "DDP + AC", "B-SDP 1/2", "B-SDP 1/2 + AC", "B-SDP 1/2 + FSDP2 2",
                                         "B-SDP 1/2 + FSDP2 2 + AC"}
    peaks = [r["peak_bytes"] for r in rows]
    assert peaks == sorted(peaks) and all(r["fits"] for r in rows)
    assert all(r["command"].startswith("slimpar train --config llama_tiny ") for r in rows)
    assert out["cluster"]["workers"] == 4


def test_top_stops_predicting_once_enough_fit(tmp_path, monkeypatch):
    """fit.top 1: the fastest modelled candidate is predicted (it fits), AC rows wait for their base, the rest
    are not predicted and say so; the ranking puts the predicted row first."""
    from slimpar.plan.fit import FitConfig, fit

    monkeypatch.setenv("SLIMPAR_CACHE", str(tmp_path))
    rows = fit(load_config(TINY), _cluster(), FitConfig(candidates="DDP,FSDP2", top=1, jobs=1))
    assert rows[0].fits and rows[0].peak is not None
    assert sum(r.peak is not None for r in rows) == 1
    ac = [r for r in rows if r.candidate.without_ac]
    assert all(r.why.startswith("not predicted") for r in rows[1:])
    assert any("fits without AC" in r.why for r in ac)
    assert rows[0].step_s == min(r.step_s for r in rows if not r.candidate.without_ac)


def test_committed_gpu_mfu_is_the_presets_start(monkeypatch, tmp_path):
    """A committed bench throughput result on a GPU gives that preset its MFU, named in the notes; without one the
    MFU is assumed and said to be."""
    from slimpar.plan import evidence

    results = tmp_path / "throughput-gpu"
    results.mkdir()
    meta = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "shape": {"size": "134m"},
            "git_commit": "abc1234"}
    lines = [{"row": "train eager", "mfu": 0.31}, {"row": "train compiled", "mfu": 0.38}, {"row": "plain", "mfu": 0.5}]
    (results / "results.json").write_text(json.dumps({"meta": meta, "lines": lines}))
    table = evidence.build_mfu(tmp_path)
    assert table["NVIDIA H100 80GB HBM3"]["mfu"] == 0.38  # the trainer's best row, not the plain loop's
    monkeypatch.setattr(evidence, "load_evidence", lambda: {"mfu": table})
    c = resolve_cluster(ClusterConfig(preset="h100"))
    assert c.mfu == 0.38 and any("measured" in n and "abc1234" in n for n in c.notes)
    c = resolve_cluster(ClusterConfig(preset="a100-80gb"))
    assert c.mfu == 0.35 and any("assumed" in n for n in c.notes)


def test_latency_counts_each_ring_step():
    """A ring all-reduce over k ranks waits on 2 (k - 1) messages a rank, an all-gather on k - 1: DDP's one bucket
    on 4 ranks adds 6 latencies; FSDP2 on the tiny LLaMA (4 blocks + the root: 5 units) 5 x 3 gathers in forward,
    4 x 3 in backward and 5 x 3 reduce-scatters (NCCL)."""
    cl = _cluster(latency_us=100.0)
    t = workload(_cfg("--parallel.mode", "ddp"), cl).traffic
    assert set(t.overlap.hops.values()) == {6}
    bandwidth = max(t.overlap.intra_max * 8 / (cl.intra_gbps * 1e9), t.overlap.inter_max * 8 / (cl.inter_gbps * 1e9))
    assert t.overlap.seconds() == pytest.approx(bandwidth + 6 * 100e-6)
    t = workload(_cfg("--parallel.mode", "fsdp"), cl).traffic
    assert set(t.gather.hops.values()) == {15} and set(t.overlap.hops.values()) == {12 + 15}
