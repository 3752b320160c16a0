"""What the launching process loads before its workers start: it validates the config, checks the folder a resume
would read and builds the run's model on the meta device, and needs none of torch's compiler (``torch._dynamo``),
DCP or pipelining for that. Each costs about a second of every multi-process run's start, before any worker starts
(measured: a 2-worker tiny SDP run took 8.2 s with them and 6.3 s without)."""

import json
import subprocess
import sys

from tests.helpers import ROOT, TINY

PROBE = """
import json, sys, tempfile
from slimpar.config import load_config
from slimpar.train.checkpoint.preflight import check_resume
from slimpar.train.run_plan import run_plan
from slimpar.train.validate.checks import validate
from slimpar.train.validate.device import resolve_device
for mode in (["--parallel.mode", "sdp", "--sdp.keep", "0.5"], ["--parallel.mode", "pipeline", "--pipeline.stages", "2",
             "--pipeline.codec", "mapl"]):
    cfg = load_config(sys.argv[1], [*mode, "--parallel.workers", "2"])
    resolve_device(cfg)
    validate(cfg)
    check_resume(tempfile.mkdtemp(), cfg)
    model = run_plan(cfg).meta_model
    assert all(p.is_meta for p in model.parameters()) and model.rope_cos.is_meta
heavy = ("torch._dynamo", "torch.distributed.checkpoint", "torch.distributed.pipelining")
print(json.dumps([m for m in heavy if m in sys.modules]))
"""


def test_the_launchers_checks_load_no_compiler_dcp_or_pipelining():
    out = subprocess.run([sys.executable, "-c", PROBE, str(TINY)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_rope_tables_on_the_meta_device_have_the_hosts_shapes():
    import torch

    from slimpar.models.llama import rope_tables

    cos, sin = rope_tables(16, 32, 10000.0)
    with torch.device("meta"):
        mcos, msin = rope_tables(16, 32, 10000.0)
    assert cos.device.type == "cpu" and mcos.is_meta and msin.is_meta
    assert (mcos.shape, msin.shape, mcos.dtype) == (cos.shape, sin.shape, torch.float32)
