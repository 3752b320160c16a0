"""The cluster a plan is made for: nodes of identical GPUs, their memory and compute, and two link classes.

A :class:`Cluster` is either named by a preset (a GPU's datasheet figures) or measured on this machine
(``preset = "this"``: its memory, and its FLOP rate from a short matmul probe); any field given explicitly
wins over the preset's. Bandwidths are per direction: ``intra_gbps`` between two GPUs of a node, ``inter_gbps``
out of a node (all of its GPUs share it). ``mfu`` is the fraction of ``tflops`` a training step achieves;
where no measured value is known it is assumed and :attr:`Cluster.notes` says so.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field

from slimpar.config import ConfigError

GIB = 1024**3
THIS_INTRA_GBPS = 10.0  # this machine's worker-to-worker link where not given (loopback, NVLink: give it)
ASSUMED_MFU = 0.35  # no committed `slimpar bench throughput` result on a GPU yet (docs/planning.md)


@dataclass(frozen=True)
class Preset:
    """One GPU's datasheet figures: usable memory, bf16 dense peak, and its intra-node link per direction."""

    memory: int  # bytes the allocator can use (torch.cuda.get_device_properties().total_memory)
    tflops: float  # bf16 dense peak, TFLOP/s (slimpar/parallel/flops.py's table)
    intra_gbps: float  # GPU-to-GPU inside a node, Gbit/s per direction
    source: str


PRESETS: dict[str, Preset] = {
    "h100": Preset(int(79.1 * GIB), 989.0, 3600.0, "H100 SXM5 80 GB: 989 TFLOP/s bf16 dense, NVLink 4 450 GB/s a way"),
    "h200": Preset(int(139.8 * GIB), 989.0, 3600.0, "H200 SXM 141 GB: 989 TFLOP/s bf16 dense, NVLink 4 450 GB/s a way"),
    "a100-80gb": Preset(int(79.1 * GIB), 312.0, 2400.0, "A100 SXM 80 GB: 312 TFLOP/s bf16, NVLink 3 300 GB/s a way"),
    "l4": Preset(int(22.0 * GIB), 121.0, 256.0, "L4 24 GB: 121 TFLOP/s bf16 dense, PCIe 4.0 x16 32 GB/s a way"),
}


@dataclass
class ClusterConfig:
    """``--cluster.*``: what the user says about the cluster; 0 (or "") = take it from the preset."""

    preset: str = "h100"  # h100 | h200 | a100-80gb | l4 | this (measured here: memory and a matmul probe)
    nodes: int = 1  # machines
    gpus_per_node: int = 0  # workers per node; 0 = 8 for a GPU preset, this machine's GPUs (or 1) for "this"
    gpu_memory: str = ""  # memory per worker, e.g. 80GiB; "" = the preset's
    intra_gbps: float = 0.0  # per direction between two workers of a node; 0 = the preset's
    inter_gbps: float = 100.0  # per direction out of a node (its workers share it)
    tflops: float = 0.0  # peak TFLOP/s per worker; 0 = the preset's (this: the matmul probe)
    mfu: float = 0.0  # fraction of tflops a step achieves; 0 = measured where known, else assumed


@dataclass(frozen=True)
class Cluster:
    """A resolved cluster: every field known, with where each assumed value came from."""

    name: str
    nodes: int
    gpus_per_node: int
    gpu_memory: int
    intra_gbps: float
    inter_gbps: float
    tflops: float
    mfu: float
    notes: tuple[str, ...] = field(default=())
    gloo: bool = False  # CPU workers: gloo's collectives (its reduce-scatter costs an all-reduce's bytes)

    @property
    def workers(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        """Ranks fill nodes in order (torchrun's --node-rank layout)."""
        return rank // self.gpus_per_node

    @property
    def flops_per_s(self) -> float:
        """What one worker achieves: peak x MFU."""
        return self.tflops * 1e12 * self.mfu

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "workers": self.workers}


def parse_size(text: str, where: str) -> int:
    """``"80GiB"``, ``"24GB"``, ``"512MiB"`` -> bytes (x1024 for KiB/MiB/GiB/TiB, x1000 for KB/MB/GB/TB)."""
    units = {"TIB": 1024**4, "GIB": GIB, "MIB": 1024**2, "KIB": 1024, "TB": 1e12, "GB": 1e9, "MB": 1e6, "KB": 1e3,
             "B": 1}
    s = text.strip().upper()
    for unit, factor in units.items():
        if s.endswith(unit):
            try:
                value = float(s[: -len(unit)])
            except ValueError:
                break
            if value > 0:
                return int(value * factor)
            break
    raise ConfigError(f"cluster.gpu_memory = {text!r}: expected a positive size such as 80GiB, 24GB or 512MiB")


def _check(cc: ClusterConfig) -> None:
    """One ConfigError naming the first bad field."""
    if cc.preset not in (*PRESETS, "this"):
        raise ConfigError(f"cluster.preset = {cc.preset!r} is not one of: {', '.join([*PRESETS, 'this'])}")
    for name in ("nodes",):
        if getattr(cc, name) < 1:
            raise ConfigError(f"cluster.{name} = {getattr(cc, name)}: must be at least 1")
    if cc.gpus_per_node < 0:
        raise ConfigError(f"cluster.gpus_per_node = {cc.gpus_per_node}: must be at least 1 (0 = the preset's)")
    if cc.inter_gbps <= 0 and cc.nodes > 1:
        raise ConfigError(f"cluster.inter_gbps = {cc.inter_gbps}: nodes need a link; give Gbit/s per direction > 0")
    for name in ("intra_gbps", "tflops", "mfu"):
        if getattr(cc, name) < 0:
            raise ConfigError(f"cluster.{name} = {getattr(cc, name)}: must be positive (0 = the preset's)")
    if cc.mfu > 1:
        raise ConfigError(f"cluster.mfu = {cc.mfu}: a fraction of the peak, at most 1")


def resolve_cluster(cc: ClusterConfig, measured_mfu: float | None = None) -> Cluster:
    """The cluster ``cc`` describes: explicit fields first, then the preset (or this machine's measurements).
    ``measured_mfu``: a committed throughput result's MFU for this GPU, used where ``cc.mfu`` is 0."""
    _check(cc)
    notes: list[str] = []
    if cc.preset == "this":
        base = this_machine()
        notes.append(f"this machine: {base.source}")
        per_node = cc.gpus_per_node or _local_gpus()
    else:
        base = PRESETS[cc.preset]
        notes.append(base.source)
        per_node = cc.gpus_per_node or 8
    memory = parse_size(cc.gpu_memory, "gpu_memory") if cc.gpu_memory else base.memory
    if cc.preset == "this" and not cc.gpu_memory and not _local_gpus_cuda():
        memory = base.memory // per_node  # the workers of a CPU "node" share its memory
    mfu = cc.mfu or measured_mfu or ASSUMED_MFU
    if not cc.mfu:
        notes.append(f"MFU {mfu:.2f}: " + ("measured (slimpar bench throughput)" if measured_mfu else
                                          "assumed; measure it with slimpar bench throughput and pass --cluster.mfu"))
    intra = cc.intra_gbps or base.intra_gbps
    if not intra:
        intra = THIS_INTRA_GBPS
        notes.append(f"intra-node link assumed {intra:g} Gbit/s (not measured; --cluster.intra_gbps)")
    gloo = cc.preset == "this" and not _local_gpus_cuda()
    return Cluster(name=cc.preset, nodes=cc.nodes, gpus_per_node=per_node, gpu_memory=memory,
                   intra_gbps=intra, inter_gbps=cc.inter_gbps,
                   tflops=cc.tflops or base.tflops, mfu=mfu, notes=tuple(notes), gloo=gloo)


def _local_gpus_cuda() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _local_gpus() -> int:
    return _local_gpus_cuda() or 1


def this_machine(probe_s: float = 0.3) -> Preset:
    """This machine as a preset: GPU 0's memory (else the RAM) and a matmul probe's rate (bf16 on a GPU, fp32
    on the CPU with every thread), about ``probe_s`` seconds. Its intra-node link is not measured: 0 means
    the worker-to-worker speed must be given (``--cluster.intra_gbps``) where it matters."""
    import torch

    if torch.cuda.is_available():
        memory = torch.cuda.get_device_properties(0).total_memory
        device, dtype, n = torch.device("cuda"), torch.bfloat16, 8192
    else:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        device, dtype, n = torch.device("cpu"), torch.float32, 1024
    tflops = matmul_tflops(device, dtype, n, probe_s)
    what = "GPU 0" if device.type == "cuda" else f"CPU, {os.cpu_count()} threads"
    return Preset(memory, tflops, 0.0, f"{what}: {memory / GIB:.1f} GiB, matmul probe {tflops:.3g} TFLOP/s "
                                       f"({str(dtype).removeprefix('torch.')} {n}x{n})")


def matmul_tflops(device, dtype, n: int, seconds: float) -> float:
    """Achieved TFLOP/s of repeated n x n matmuls for about ``seconds`` (after one warm-up product)."""
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    (a @ b).sum().item()
    count, t0 = 0, time.perf_counter()
    while True:
        c = a @ b
        count += 1
        if count % 4 == 0:
            c.sum().item()  # a host sync on a GPU
            if time.perf_counter() - t0 >= seconds:
                break
    return 2 * n**3 * count / (time.perf_counter() - t0) / 1e12
