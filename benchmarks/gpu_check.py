"""``slimpar bench gpu``: the prepared device check, a list of short rows that each checks on a real GPU what the
CPU proxies cannot (NCCL, cuda:gloo, bf16, torch.compile with inductor/Triton, TF32, CUDA memory at paper size).

Each row is a fresh process (``python -m slimpar ...``, or ``torchrun``) under its own time limit, sized at 1.6-2
times what the row took on a fresh H200 machine (docs/results/gpu: first imports and CUDA's start-up cost about 15 s a
process there), so that each part's limits add up to at most :data:`BUDGET_S` (8 minutes, one device call). A row that
fails or runs out of time is recorded with its exit code, the end of its output and whatever numbers it had written
(its metrics, a JSON line it printed), and the next row runs. ``results.json`` is rewritten after every row, so a
check cut short still returns what it measured; it records the torch, CUDA and NCCL versions the rows ran on.

Two parts, one device call each: ``check`` (the default: does each path work on a GPU) and ``speed`` (``slimpar bench
throughput`` at 134M and 1B: step time, MFU and peak memory of the plain loop, the trainer and the virtual pipeline,
eager and compiled, and whether CUDA graphs pay). ``--rows speed`` runs the second. The speed rows' limits are
estimates (no GPU has run them yet: compiling a 134M block costs most of a row); the throughput bench writes its
results after every row, so a row cut short keeps what it measured.

The device machine has no slimpar installed and no internet: the rows run from the checkout
(``PYTHONPATH``) on the machine's own torch, train on a corpus made of slimpar's own source files (real text that
travels with the tree: ``--data.corpus path``), and evaluate in-domain only. ``--device cpu`` runs the same rows on
gloo and the CPU, as a smoke test of the rows themselves (rows that need CUDA say so and are not run).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BUDGET_S = 480  # the sum of every row's time limit: the check's own bound (8 minutes)
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class GpuRow:
    """One check: ``argv`` run from the checkout with ``{out}``, ``{corpus}``, ``{device}`` and ``{backend}``
    filled in, at most ``limit_s`` seconds. ``cuda_only``: meaningless without a GPU (not run on CPU)."""

    name: str
    what: str
    argv: list[str]  # one command; ``then`` runs after it when it succeeds (within the same limit)
    limit_s: int
    cuda_only: bool = False
    part: str = "check"  # check | speed: the rows one device call runs
    env: dict = field(default_factory=dict)
    then: list[str] = field(default_factory=list)


def _train(*args: str) -> list[str]:
    return [sys.executable, "-m", "slimpar", "train", "--config", "llama_tiny", "--data.corpus", "path",
            "--data.path", "{corpus}", "--data.ood", "none", "--parallel.device", "{device}", "--train.steps", "12",
            "--log.every", "4", "--eval.batches", "2", "--log.progress", "false", "--out", "{out}", *args]


def _torchrun(*args: str) -> list[str]:
    argv = _train(*args)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", *argv[1:]]


def _throughput(size: str, rows: str) -> list[str]:
    return [sys.executable, "-m", "slimpar", "bench", "throughput", "--size", size, "--device", "{device}",
            "--quick", "--rows", rows, "--out", "{out}"]


SDP1 = ["--parallel.mode", "sdp", "--sdp.keep", "1.0", "--checkpoint.every", "6"]
VIRTUAL_PIPELINE = ["--model.tie_embeddings", "false", "--parallel.mode", "pipeline", "--pipeline.virtual", "true",
                    "--pipeline.stages", "4", "--train.dtype", "bf16"]
ROWS = [
    GpuRow("env and data", "the GPU, driver, torch, CUDA and NCCL versions; the corpus tokenized once for the rest",
           [sys.executable, "-m", "benchmarks.gpu_check", "env", "{corpus}"], 25),
    GpuRow("torchrun DDP, NCCL, device auto", "1 rank under torchrun with parallel.device auto (CUDA and NCCL "
           "expected): NCCL collectives of the trainer, guard and evaluation",
           _torchrun("--parallel.mode", "ddp", "--train.dtype", "bf16", "--parallel.device", "auto"), 35),
    GpuRow("torchrun SDP, NCCL, DCP resume", "SDP under torchrun on NCCL, stopped with a checkpoint and resumed",
           _torchrun(*SDP1, "--train.stop_after", "6"), 60, then=_torchrun(*SDP1)),
    GpuRow("launcher DDP, 2 ranks, cuda:gloo", "slimpar's own launcher (torch's elastic agent) and DDP on one GPU",
           _train("--parallel.mode", "ddp", "--parallel.workers", "2", "--parallel.backend", "gloo"), 45),
    GpuRow("virtual B-SDP, bf16", "4 simulated SDP workers on one GPU",
           _train("--parallel.mode", "sdp", "--sdp.virtual", "true", "--train.dtype", "bf16"), 30),
    GpuRow("batched Bb-SDP", "4 workers in one routed pass",
           _train("--parallel.mode", "sdp", "--sdp.virtual", "true", "--sdp.virtual_batched", "true",
                  "--sdp.regime", "backward"), 30),
    GpuRow("4 ranks on one GPU, cuda:gloo", "SDP holder collectives on CUDA tensors through gloo",
           _train("--parallel.mode", "sdp", "--parallel.workers", "4", "--parallel.backend", "gloo"), 50),
    GpuRow("virtual pipeline MAPL + RVQ, bf16", "4 stages, 8x and RVQ codebook sync on one GPU",
           _train(*VIRTUAL_PIPELINE, "--pipeline.codec", "mapl", "--pipeline.compression", "8",
                  "--pipeline.compression_of", "payload", "--pipeline.rvq.levels", "2"), 30),
    GpuRow("virtual pipeline SSN and none, bf16", "the SSN baseline, then no codec (no Stiefel parameter to clip)",
           _train(*VIRTUAL_PIPELINE, "--pipeline.codec", "ssn"), 45,
           then=_train(*VIRTUAL_PIPELINE, "--pipeline.codec", "none", "--out", "{out}/none")),
    GpuRow("torch.compile, inductor", "every block compiled with Triton kernels, virtual SDP",
           _train("--parallel.mode", "sdp", "--sdp.virtual", "true", "--train.compile", "true"), 50, cuda_only=True),
    GpuRow("CUDA peak vs plan --memory, 134M", "max_memory_allocated of DDP and SDP workers at 134M; the "
           "prediction with no corpus installed",
           [sys.executable, "-m", "benchmarks.gpu", "--out", "{out}", "--size", "134m", "--batch", "8",
            "--seq", "1024", "--predict"], 60, cuda_only=True),
    GpuRow("SPEL and Polar Express with TF32 on", "orthogonality kept at pinned fp32 with TF32 and bf16 A",
           [sys.executable, "-m", "benchmarks.gpu_check", "tf32", "{device}"], 20, cuda_only=True),
    # the speed part: slimpar bench throughput, a device call of its own
    GpuRow("throughput 134M, compile", "the trainer's compiled step against a plain compiled loop (target 1.05x), "
           "MFU (target 40%), CUDA graphs", _throughput("134m", "plain,trainer"), 215, cuda_only=True, part="speed"),
    GpuRow("throughput 134M, virtual pipeline", "one MAPL boundary step alone, 16k tokens at d = 768 (target 1 ms); "
           "the one-pass virtual pipeline against single (target 1.2x) and MAPL's codecs against none (4x: 1.10x, "
           "16x + RVQ: 1.15x)", _throughput("134m", "boundary,train eager,pipeline"), 125, cuda_only=True,
           part="speed"),
    GpuRow("throughput 1B", "MFU of the plain loop and the compiled trainer at 1B (target 50%)",
           _throughput("1b", "plain eager,plain compiled,train compiled"), 140, cuda_only=True, part="speed"),
]
PARTS = ("check", "speed")


def check_budget(rows: list[GpuRow]) -> int:
    """The longest part's limits; each part is one device call within :data:`BUDGET_S`."""
    totals = {part: sum(r.limit_s for r in rows if r.part == part) for part in PARTS}
    for part, total in totals.items():
        if total > BUDGET_S:
            raise ValueError(f"the device check's {part} rows may take {total} s; its budget is {BUDGET_S} s")
    return max(totals.values())


def select(only: set[str] | None) -> list[GpuRow]:
    """The rows named in ``only`` (row names or parts); by default the ``check`` part."""
    only = only or {"check"}
    unknown = only - {r.name for r in ROWS} - set(PARTS)
    if unknown:
        from slimpar.config import ConfigError

        raise ConfigError(f"the device check has no row or part {', '.join(sorted(unknown))}")
    return [r for r in ROWS if r.name in only or r.part in only]


def corpus(out: Path) -> Path:
    """slimpar's own source (the library and its benchmarks) as one text file: real text that travels with the
    checkout (no package needed)."""
    path = out / "corpus.txt"
    if not path.exists():
        files = [f for top in ("slimpar", "benchmarks") for f in sorted((ROOT / top).rglob("*.py"))]
        files += sorted((ROOT / "docs").rglob("*.md"))
        path.write_text("\n\n".join(f.read_text() for f in files))
    return path


def _argv(argv: list[str], out: Path, text: Path, device: str) -> list[str]:
    fill = {"{out}": str(out), "{corpus}": str(text), "{device}": device}
    for key, value in fill.items():
        argv = [a.replace(key, value) for a in argv]
    return argv


def _folder(out: Path, row: GpuRow) -> Path:
    return out / "".join(c if c.isalnum() else "_" for c in row.name)


def _run(argv: list[str], env: dict, limit_s: float) -> tuple[int | None, str]:
    """(exit code or None on timeout, the end of its output). At the limit the whole process group goes (a
    torchrun agent's workers with it), and what the command had printed is kept."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(limit_s, 1))
        return proc.returncode, out[-3000:]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, (out or "")[-3000:]


def run_row(row: GpuRow, out: Path, text: Path, device: str) -> dict:
    """Run one row to its end or its limit; what it did, never an exception."""
    if row.cuda_only and device != "cuda":
        return {"row": row.name, "status": "not run", "why": "needs CUDA"}
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore", **row.env)
    t0, tail, status, rc = time.perf_counter(), "", "ok", 0
    for argv in [row.argv] + ([row.then] if row.then else []):
        rc, tail = _run(_argv(argv, _folder(out, row), text, device), env, row.limit_s - (time.perf_counter() - t0))
        status = "timeout" if rc is None else "ok" if rc == 0 else "failed"
        if status != "ok":
            break
    record = {"row": row.name, "what": row.what, "status": status, "rc": rc, "limit_s": row.limit_s,
              "seconds": round(time.perf_counter() - t0, 1), "tail": tail}
    return record | _numbers(_folder(out, row), tail)


SUMMARY_KEYS = ("val_loss", "train_loss", "step_time_s", "peak_mem_bytes", "cuda_max_allocated_bytes",
                "cuda_max_reserved_bytes", "max_orth_error", "device", "dtype")


def _numbers(folder: Path, tail: str) -> dict:
    """The numbers a row left, finished or not: its summary.json (else the last record of its metrics.jsonl, for a
    run cut short), a probe's results.json, and the JSON objects it printed (the probes print one at the end)."""
    found: dict = {}
    s = folder / "summary.json"
    if s.exists():
        d = json.loads(s.read_text())
        found["summary"] = {k: d[k] for k in SUMMARY_KEYS if k in d}
    elif (folder / "metrics.jsonl").exists():
        lines = (folder / "metrics.jsonl").read_text().splitlines()
        found["partial"] = json.loads(lines[-1]) if lines else {}
    more = {f.parent.name: _numbers(f.parent, "")["summary"] for f in sorted(folder.glob("*/summary.json"))}
    if more:  # a row's second run in a folder of its own (``--out {out}/none``)
        found["more"] = more
    if (folder / "results.json").exists():
        found["results"] = json.loads((folder / "results.json").read_text())
    printed = [_json_object(line) for line in tail.splitlines()]
    if any(printed):
        found["printed"] = [p for p in printed if p]
    return found


def _json_object(line: str) -> dict | None:
    line = line.strip()
    if not (line.startswith("{") and line.endswith("}")):
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def versions() -> dict:
    """The torch, CUDA, NCCL and GPU the rows run on (the rows are subprocesses of this Python, on its torch)."""
    import torch

    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "gpu": torch.cuda.get_device_name() if cuda else None, "python": sys.version.split()[0],
            "commit": os.environ.get("SLIMPAR_COMMIT") or _commit()}


def _commit() -> str | None:
    from slimpar.train.sinks.metrics import git_commit

    return git_commit()


def default_folder() -> Path:
    """docs/results/gpu/<date>-<commit>: every device run's results are kept, dated, with the commit they ran."""
    commit = (os.environ.get("SLIMPAR_COMMIT") or _commit() or "nocommit")[:7]
    return ROOT / "docs" / "results" / "gpu" / f"{time.strftime('%Y-%m-%d', time.gmtime())}-{commit}"


def bench_gpu(out: Path, device: str = "cuda", only: set[str] | None = None) -> dict:
    """Run the rows (``only``: these names), writing ``results.json`` after each and ``report.md`` at the end."""
    rows = select(only)
    check_budget(rows)
    runs = out / "runs"  # the rows' run folders and the corpus: scratch, never committed with the results
    runs.mkdir(parents=True, exist_ok=True)
    (runs / ".gitignore").write_text("*\n")
    text = corpus(runs)
    data = {"device": device, "budget_s": BUDGET_S, "limits_s": sum(r.limit_s for r in rows),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "versions": versions(), "rows": []}
    for row in rows:
        print(f"[gpu check] {row.name} (at most {row.limit_s} s) ...", flush=True)
        data["rows"].append(run_row(row, runs, text, device))
        (out / "results.json").write_text(json.dumps(data, indent=1))
        print(f"[gpu check] {row.name}: {data['rows'][-1]['status']} in {data['rows'][-1].get('seconds')} s",
              flush=True)
    (out / "report.md").write_text(report(data))
    return data


def report(data: dict) -> str:
    v = data.get("versions", {})
    lines = [f"# Device check ({data['device']}; row limits {data['limits_s']} s of a {data['budget_s']} s budget)",
             "", f"{data.get('date', '')}; commit {v.get('commit')}; {v.get('gpu')}; torch {v.get('torch')}, "
             f"CUDA {v.get('cuda')}, NCCL {v.get('nccl')}", "",
             "| row | status | seconds (limit) | what it checks |", "|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['row']} | {r['status']} | {r.get('seconds', '–')} ({r.get('limit_s', '–')}) | "
                     f"{r.get('what', r.get('why', ''))} |")
    return "\n".join(lines) + "\n"


def tf32_check(device: str) -> dict:
    """SPEL on a bf16 A and Polar Express with TF32 switched on: both must stay orthogonal to fp32 precision
    (pinned_fp32), where TF32 matmuls alone would leave about 1e-3. Also SPEL's step never calling
    ``torch.cuda.synchronize`` (0 expected), and its median time between CUDA events (optim.timing)."""
    import torch

    from slimpar.codecs.stiefel import orth_error, polar_express, random_stiefel
    from slimpar.optim.spel import SPELAdamW

    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device(device)
    gen = torch.Generator(dev).manual_seed(0)
    A = torch.nn.Parameter(random_stiefel(1024, 128).to(dev, torch.bfloat16))
    opt = SPELAdamW([{"params": [A], "manifold": "stiefel", "lr": 0.01}])
    waits, timers = [], []
    synchronize = torch.cuda.synchronize
    torch.cuda.synchronize = lambda *a, **k: (waits.append(1), synchronize(*a, **k))  # SPEL's step must not wait
    try:
        for _ in range(20):
            A.grad = torch.randn(A.shape, device=dev, generator=gen).to(A.dtype)
            opt.step()
            timers.append(opt.last_spel_timer)
    finally:
        torch.cuda.synchronize = synchronize
    X = torch.randn(4096, 256, device=dev, generator=gen)
    raw = (X @ X.mT).double() - X.double() @ X.double().mT  # what TF32 does to an unpinned product
    return {"tf32_on": torch.backends.cuda.matmul.allow_tf32, "spel_master_orth": opt.last_orth_error,
            "polar_express_orth": orth_error(polar_express(X)), "tf32_product_error": float(raw.abs().max()),
            "spel_step_synchronizes": len(waits), "spel_ms_median": 1e3 * statistics.median(t.seconds for t in timers)}


def env_and_data(text: str) -> dict:
    """What the machine is, and the corpus's tokenizer and tokens built into the cache the rows then read."""
    import torch

    from slimpar.train.build import build_data
    from slimpar.train.validate.checks import load_run_config

    cuda = torch.cuda.is_available()
    data = build_data(load_run_config("llama_tiny", ["--data.corpus", "path", "--data.path", text, "--data.ood",
                                                     "none"]))
    gpu = torch.cuda.get_device_name() if cuda else None
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": gpu, "nccl": nccl, "data": data.describe()}


if __name__ == "__main__":
    what, arg = sys.argv[1], sys.argv[2]
    print(json.dumps(tf32_check(arg) if what == "tf32" else env_and_data(arg), default=str))
