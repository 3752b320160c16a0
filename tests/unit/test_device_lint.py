"""A lint over every ``torch.distributed`` call that moves a tensor (collectives and point to point) in slimpar/.

NCCL takes CUDA tensors only (docs/gpu.md). The stand-in accelerator tests run these sites; this lint keeps the
list honest without running anything:

1. every call site is in :data:`SITES`, which says where its tensors come from; a new site fails here until it
   is added (and covered by a stand-in test: tests/standin_run.py runs every mode);
2. in a function that calls one, every tensor factory passes ``device=`` (a scalar made for a collective on
   the CPU is the bug issue 39 found in the guard, the logged loss and evaluation);
3. ``torch.distributed`` is only ever imported as ``dist`` and its collectives never by name, so 1 and 2 see
   every call;
4. an empty list's fallback names its device: a tensor factory that is a branch of a conditional expression
   (``torch.stack(xs) if xs else torch.zeros(())``) passes ``device=`` (or is host bookkeeping, listed in
   :data:`HOST_BRANCHES`), and a device read off a possibly empty
   iterable (``next((p.device for p in ps), ...)``, or ``torch.device("cpu")`` as a fallback) is listed in
   :data:`FALLBACKS` with why the CPU is right there (the pipeline's clip stacked a CPU zero, made for an empty
   list of projectors, with device scalars);
5. point to point goes through ``parallel/device.send`` / ``recv`` (which stage a GPU tensor through the host
   where the group is gloo's), except at the pipeline's links, listed in :data:`P2P_AS_IS`.
"""

from __future__ import annotations

import ast
import functools

from tests.helpers import ROOT

COMM = {"all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce_scatter",
        "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
        "batch_isend_irecv", "P2POp"}
FACTORIES = {"tensor", "zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint", "eye", "linspace",
             "as_tensor"}
SITES = {  # "file::function": where the tensors that enter its collectives live
    "slimpar/parallel/device.py::send": "moved to group_device(group): gloo's sends take host tensors only",
    "slimpar/parallel/device.py::recv": "a buffer on group_device(group), copied into the caller's tensor",
    "slimpar/parallel/average.py::average_grads": "gradients: on the model's device",
    "slimpar/pipeline/evaluate.py::all_reduce_sum.reduce": "moved to the device it is given (the run's)",
    "slimpar/pipeline/stage.py::CodecPipelineStage._ops": "codec messages from device activations; receive "
                                                         "buffers from WireSpec.empty(self.device)",
    "slimpar/pipeline/wire.py::P2PLink.isend": "packets made from device tensors",
    "slimpar/pipeline/wire.py::P2PLink.irecv": "buffers on the link's device",
    "slimpar/pipeline/wire.py::P2PLink.exchange": "packets from device tensors; buffers on the link's device",
    "slimpar/sdp/comm.py::GroupComm.all_reduce": "gradient buckets (sdp/sync.py: on the parameters' device)",
    "slimpar/sdp/comm.py::GroupComm.broadcast": "refresh buffers cut from the parameters",
    "slimpar/sdp/comm.py::GroupComm.all_gather": "fingerprints made on HolderSync.device",
    "slimpar/sdp/comm.py::GroupComm.sum_all": "the clip's squared norms, on the gradients' device",
    "slimpar/sdp/comm.py::GroupComm.broadcast_from": "the gathered model, materialized on the device asked",
    "slimpar/train/evaluate.py::_eval_split": "sums on the model's device",
    "slimpar/train/guard.py::StepGuard.check": "group_device(group): made there, or moved there (_values)",
    "slimpar/train/job/preempt.py::StopRequest.agreed": "the run's device, passed in",
    "slimpar/train/memory/predict.py::_mean_in_place": "DDP's bucket (fake backend)",
    "slimpar/train/strategies/base.py::Strategy.reduce_loss": "group_device(group)",
    "slimpar/train/strategies/hybrid.py::HybridPipelineStrategy._sum_pipeline": "moved to ctx.device",
    "slimpar/train/strategies/pipeline.py::PipelineStrategy._replica_sum": "the PCA Gram matrix, from activations",
    "slimpar/train/strategies/pipeline.py::PipelineStrategy._touched_rows": "mask on the rows' device",
    "slimpar/train/strategies/pipeline.py::PipelineStrategy._sum_pipeline": "moved to ctx.device",
    "slimpar/train/strategies/pipeline.py::PipelineStrategy.reduce_loss": "created on ctx.device",
}
P2P = {"send", "recv", "isend", "irecv", "batch_isend_irecv", "P2POp"}
# Point-to-point sites that send the run's device tensors as they are. gloo's sends take host tensors only (4
# cuda:gloo SDP ranks on one H200 failed in the evaluation gather: "writev: Bad address"); every other site sends
# through parallel/device.send / recv, which stage through the host where the group is gloo's.
P2P_AS_IS = {
    "slimpar/pipeline/stage.py::CodecPipelineStage._ops": "pipelines: CUDA stages need NCCL (validate/limits.py "
                                                         "refuses cuda:gloo pipelines)",
    "slimpar/pipeline/wire.py::P2PLink.isend": "the same",
    "slimpar/pipeline/wire.py::P2PLink.irecv": "the same",
    "slimpar/pipeline/wire.py::P2PLink.exchange": "the same",
    "slimpar/parallel/device.py::send": "the staging itself",
    "slimpar/parallel/device.py::recv": "the staging itself",
}
FALLBACKS = {  # "file::function": a device read off a possibly empty iterable, and why the CPU is right when empty
    "slimpar/train/guard.py::_device_of": "no tensor at all (one process, a float loss and norm): everything the "
                                         "guard then makes is on the host, and nothing is mixed",
    "slimpar/sdp/holders.py::_device": "a module without parameters, which SDP never wraps (every worker holds "
                                       "the model's shared parameters)",
    "slimpar/optim/spel.py::SPELAdamW._timed_spel": "no CUDA parameter stepped: no kernel to time on a device, so "
                                                    "the span is the host's wall time (optim.timing); nothing is made",
}
HOST_BRANCHES = {  # "file::function": a conditional's factory without device= that is host bookkeeping by design
    "slimpar/codecs/anchors.py::FactorizedAnchor.__init__": "the initial table, built on the host with the model, "
                                                            "which the run then moves",
    "slimpar/codecs/anchors.py::FullAnchor.__init__": "the same",
    "slimpar/sdp/apply.py::_slice_layer": "a unit index made on the host in both branches, moved where it is used",
    "slimpar/sdp/batched_routes.py::NeuronRoute.__init__": "host unit indices, moved to the device just below",
}


class _Sites(ast.NodeVisitor):
    """Communicating ``dist.*`` calls by enclosing ``Class.function`` (nested functions joined by dots), and the
    tensor factories without ``device=`` in those functions."""

    def __init__(self) -> None:
        self.scope: list[str] = []
        self.calls: dict[str, list[int]] = {}
        self.factories: dict[str, list[int]] = {}
        self.fallback_factories: dict[str, list[int]] = {}  # item 4: a factory as a conditional's branch
        self.device_fallbacks: dict[str, list[int]] = {}  # item 4: a device read off a possibly empty iterable
        self.p2p: dict[str, list[int]] = {}  # item 5: point-to-point calls

    def _scoped(self, node) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Call(self, node: ast.Call) -> None:
        f, where = node.func, ".".join(self.scope)
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.value.id == "dist" and f.attr in COMM:
                self.calls.setdefault(where, []).append(node.lineno)
            if f.value.id == "dist" and f.attr in P2P:
                self.p2p.setdefault(where, []).append(node.lineno)
            if _hostless_factory(node):
                self.factories.setdefault(where, []).append(node.lineno)
        if isinstance(f, ast.Name) and f.id == "next" and len(node.args) == 2 and (
                ".device" in ast.unparse(node.args[0]) or _is_cpu_device(node.args[1])):
            self.device_fallbacks.setdefault(where, []).append(node.lineno)
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        where = ".".join(self.scope)
        for branch in (node.body, node.orelse):
            if _hostless_factory(branch):
                self.fallback_factories.setdefault(where, []).append(branch.lineno)
            if _is_cpu_device(branch):
                self.device_fallbacks.setdefault(where, []).append(branch.lineno)
        self.generic_visit(node)


def _hostless_factory(node: ast.AST) -> bool:
    """``torch.<factory>(...)`` without ``device=``: made on the CPU whatever the run's device."""
    f = node.func if isinstance(node, ast.Call) else None
    return (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch"
            and f.attr in FACTORIES and not any(k.arg == "device" for k in node.keywords))


def _is_cpu_device(node: ast.AST) -> bool:
    return ast.unparse(node) in ("torch.device('cpu')", 'torch.device("cpu")')


@functools.cache
def _scan() -> tuple[dict[str, list[int]], dict[str, list[int]], list[str]]:
    calls, factories, imports = {}, {}, []
    for rel, tree, sites in _files():
        calls.update({f"{rel}::{k}": v for k, v in sites.calls.items()})
        factories.update({f"{rel}::{k}": v for k, v in sites.factories.items() if k in sites.calls})
        imports += [f"{rel}:{n.lineno}" for n in ast.walk(tree) if _foreign_import(n)]
    return calls, factories, imports


@functools.cache
def _files() -> list[tuple]:
    out = []
    for path in sorted((ROOT / "slimpar").rglob("*.py")):
        rel, tree = path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())
        sites = _Sites()
        sites.visit(tree)
        out.append((rel, tree, sites))
    return out


def _foreign_import(node: ast.AST) -> bool:
    """``import torch.distributed as <not dist>`` or ``from torch.distributed import <a collective>``."""
    if isinstance(node, ast.Import):
        return any(a.name == "torch.distributed" and a.asname not in (None, "dist") for a in node.names)
    if isinstance(node, ast.ImportFrom) and node.module in ("torch.distributed", "torch.distributed.distributed_c10d"):
        return any(a.name in COMM for a in node.names)
    return False


def test_every_communicating_call_site_is_listed():
    calls, _, _ = _scan()
    unlisted = {site: lines for site, lines in calls.items() if site not in SITES}
    assert not unlisted, f"new collective or send call sites, add them to SITES with their tensors' device: {unlisted}"


def test_tensors_made_next_to_a_collective_name_their_device():
    _, factories, _ = _scan()
    assert not factories, f"tensor factories without device= in functions that communicate: {factories}"


def test_torch_distributed_is_imported_as_dist_only():
    _, _, imports = _scan()
    assert not imports, f"torch.distributed imported under another name, or a collective by name: {imports}"


def test_an_empty_lists_fallback_names_its_device():
    """Item 4: ``f(xs) if xs else torch.zeros(())``: the empty case's tensor is made on the CPU whatever the device
    of the others it then meets (the pipeline's clip, issue 46; BatchedSDP's norm; the guard's finite check)."""
    hostless = {f"{rel}::{k}": v for rel, _, sites in _files() for k, v in sites.fallback_factories.items()}
    unlisted = {site: lines for site, lines in hostless.items() if site not in HOST_BRANCHES}
    assert not unlisted, f"a conditional's tensor factory without device= (an empty list's fallback): {unlisted}"
    assert set(HOST_BRANCHES) <= set(hostless), "HOST_BRANCHES lists sites that no longer need it"


def test_devices_read_off_possibly_empty_iterables_are_listed():
    """Item 4: a device taken from the first of some tensors falls back when there are none; each such site is
    listed with why its fallback is right (a new one fails here until it is)."""
    found = {f"{rel}::{k}": v for rel, _, sites in _files() for k, v in sites.device_fallbacks.items()}
    assert sorted(found) == sorted(FALLBACKS), f"device fallbacks found: {found}; listed: {sorted(FALLBACKS)}"


def test_point_to_point_stages_gpu_tensors_for_gloo():
    """Item 5: a ``dist.send`` of a CUDA tensor over gloo fails in its TCP transport; outside the pipeline's links
    (NCCL on a GPU) every point-to-point call is parallel/device's, which sends from the group's device."""
    p2p = {f"{rel}::{k}": v for rel, _, sites in _files() for k, v in sites.p2p.items()}
    unlisted = {site: lines for site, lines in p2p.items() if site not in P2P_AS_IS}
    assert not unlisted, f"point to point outside parallel/device.send / recv: {unlisted}"
