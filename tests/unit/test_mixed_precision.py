"""Mixed precision: the Stiefel math stays fp32 under bf16 autocast and for bf16 parameters, SDP's holder sums are
fp32 for bf16 gradients, and a module's training forward can be autocast from outside."""

import copy

import torch
from torch import nn

from slimpar.codecs.stiefel import orth_error, pinned_fp32, polar_express, random_stiefel
from slimpar.models import Llama, LlamaConfig
from slimpar.optim.spel import SPELAdamW
from slimpar.parallel.precision import autocast_forward
from slimpar.sdp.components import model_components
from slimpar.sdp.plan import plan_components
from slimpar.sdp.virtual import VirtualSDP


def test_polar_express_is_orthogonal_to_fp32_precision_under_bf16_autocast():
    X = torch.randn(512, 64, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a caller's bf16 region (the old code gave 0.054)
        Q = polar_express(X)
    assert Q.dtype == torch.float32 and orth_error(Q) < 1e-5
    assert torch.is_autocast_enabled("cpu") is False  # pinned_fp32 restored the caller's state


def test_pinned_fp32_restores_the_callers_precision_settings():
    cuda, mkldnn = torch.backends.cuda.matmul, torch.backends.mkldnn.matmul
    old = cuda.fp32_precision, mkldnn.fp32_precision
    try:
        cuda.fp32_precision, mkldnn.fp32_precision = "tf32", "bf16"
        with pinned_fp32():
            assert (cuda.fp32_precision, mkldnn.fp32_precision) == ("ieee", "ieee")
        assert (cuda.fp32_precision, mkldnn.fp32_precision) == ("tf32", "bf16")
    finally:
        cuda.fp32_precision, mkldnn.fp32_precision = old


def _spel_run(A: nn.Parameter, grads: list[torch.Tensor]) -> SPELAdamW:
    opt = SPELAdamW([{"params": [A], "manifold": "stiefel", "lr": 0.05, "momentum": 0.9}])
    for g in grads:
        A.grad = g.to(A.dtype)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # stepping inside a bf16 region changes nothing
            opt.step()
    return opt


def test_spel_steps_a_bf16_parameter_through_an_fp32_master_as_an_fp32_run_would():
    gen = torch.Generator().manual_seed(1)
    start = random_stiefel(96, 12, gen)
    grads = [torch.randn(96, 12, generator=gen).to(torch.bfloat16) for _ in range(8)]
    low = nn.Parameter(start.to(torch.bfloat16))
    ref = nn.Parameter(start.to(torch.bfloat16).float())  # the same starting values, kept in fp32
    opt = _spel_run(low, grads)
    _spel_run(ref, grads)  # the same bf16 gradients
    master = opt.state[low]["master"]
    assert torch.equal(master, ref.detach())  # the master is exactly the fp32 run's A
    assert torch.equal(low.detach(), master.to(torch.bfloat16))
    assert orth_error(master) < 1e-5 and opt.last_orth_error < 1e-5
    assert orth_error(low.float()) > 1e-4  # the bf16 copy alone could not hold the constraint


def _tiny_bf16_llama(seed: int) -> Llama:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
    return Llama(cfg).to(torch.bfloat16)


def test_sdp_holder_sums_of_bf16_gradients_are_fp32_sums_rounded_once():
    model = _tiny_bf16_llama(0)
    comps, shared, shared_bytes = model_components(model)
    plan = plan_components(comps, shared_bytes, 4, keep=1.0, shared_params=shared)  # every worker holds all
    v = VirtualSDP(model, plan, regime="forward")
    gen = torch.Generator().manual_seed(3)
    for m in v.modules:
        x = torch.randint(0, 64, (2, 16), generator=gen)
        m(x).float().logsumexp(-1).mean().backward()
    name = "layers.1.feed_forward.w2.weight"
    own = [dict(m.named_parameters())[name].grad.clone() for m in v.modules]
    v.sync()
    want = (torch.stack([g.float() for g in own]).sum(0) / 4).to(torch.bfloat16)  # one rounding, at the end
    got = dict(v.modules[0].named_parameters())[name].grad
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    summed_in_bf16 = own[0] + own[1] + own[2] + own[3]  # what bf16 buckets would compute, rounding each add
    assert not torch.equal((summed_in_bf16 / 4), want)  # so the check above can tell the two apart


def test_autocast_forward_casts_only_while_training_and_survives_deepcopy():
    lin = nn.Linear(8, 8)
    autocast_forward(lin, "cpu")
    x = torch.randn(2, 8)
    assert lin(x).dtype == torch.bfloat16
    lin.eval()
    assert lin(x).dtype == torch.float32
    twin = copy.deepcopy(lin).train()
    with torch.no_grad():
        twin.weight.zero_()
    assert twin(x).dtype == torch.bfloat16 and not torch.equal(twin(x), lin.train()(x))  # bound to the copy
    assert torch.equal(lin.state_dict()["weight"], lin.weight)  # names and state untouched
