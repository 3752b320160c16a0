"""Run under torchrun (gloo): SDP and a pipeline on a Hugging Face LlamaForCausalLM with random weights.

Writes rank<r>.json in the working directory (one file per rank) with what tests/distributed/test_hf_models.py compares:
- SDP on the HF model (blocks="model.layers") against SDP on slimpar's Llama loaded with the same
  weights: losses per step, and the gathered full models (HF names) at the end;
- a 2-stage pipeline with codec "none" cut from the HF model against the HF model trained in one process.
"""

import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import ScheduleGPipe
from transformers import LlamaConfig, LlamaForCausalLM

import slimpar
from slimpar.models.hf_llama import from_hf_model, to_hf_state_dict
from slimpar.pipeline import ByteCounter, CodecPipelineStage, CodecSpec, build_stages

V, T = 256, 16


def hf_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def loss_of(logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())


def train_sdp(model, level: str, hf: bool, steps: int = 3) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    blocks = {"blocks": "model.layers"} if hf else {}
    if level == "block":
        plan = slimpar.sdp.plan_blocks(model, world, keep=0.5, **blocks)
    else:
        plan = slimpar.sdp.plan_neurons(model, world, keep=0.5, groups=4, **blocks)
    sdp = slimpar.SubnetworkDataParallel(model, plan, regime="forward")
    opt = torch.optim.AdamW(sdp.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, V, (4, T), generator=data)
        out = sdp(x)
        loss = loss_of(out.logits if hf else out, x)
        loss.backward()
        sdp.sync()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    full = sdp.gather_full_model()
    state = full.state_dict() if hf else to_hf_state_dict(full.state_dict(), tied=False)
    state = {k: v for k, v in state.items() if "rotary" not in k}
    return {"losses": losses, "mask": plan.mask.tolist(), "state": state}


def train_pipeline(steps: int = 2) -> list[float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = from_hf_model(hf_model())
    specs = [CodecSpec("none", boundary=p, dim=64, rank=64, vocab=V, seed=0) for p in range(world - 1)]
    (stage,) = build_stages(model, world, [rank], specs)
    pp = CodecPipelineStage(stage, (2, T), V, torch.device("cpu"), dist.group.WORLD,
                            peers=dict(enumerate(range(world))), counter=ByteCounter())
    schedule = ScheduleGPipe(pp, n_microbatches=2, loss_fn=lambda logits, y: F.cross_entropy(
        logits.flatten(0, 1), y.flatten()))
    opt = torch.optim.AdamW(stage.parameters(), lr=1e-2)
    x = torch.randint(0, V, (4, T), generator=torch.Generator().manual_seed(7))
    y = torch.roll(x, -1, dims=1)
    losses = []
    for _ in range(steps):
        out = []
        schedule.step(x, target=y, losses=out) if world == 1 else (
            schedule.step(x) if rank == 0 else schedule.step(target=y, losses=out))
        opt.step()
        opt.zero_grad()
        if out:
            losses.append(torch.stack(out).mean().item())
    return losses


def hf_reference(steps: int = 2) -> list[float]:
    """The same training as the pipeline, in one process on the HF model (mean over the 2 microbatches)."""
    model = hf_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, V, (4, T), generator=torch.Generator().manual_seed(7))
    y = torch.roll(x, -1, dims=1)
    losses = []
    for _ in range(steps):
        micro = [F.cross_entropy(model(xm).logits.flatten(0, 1), ym.flatten()) for xm, ym in
                 zip(x.chunk(2), y.chunk(2), strict=True)]
        (sum(micro) / 2).backward()  # the schedule averages microbatch gradients the same way
        opt.step()
        opt.zero_grad()
        losses.append(torch.stack([m.detach() for m in micro]).mean().item())
    return losses


def main() -> None:
    dist.init_process_group("gloo")
    out = {"rank": dist.get_rank()}
    for level in ("block", "neuron"):
        theirs = train_sdp(hf_model(), level, hf=True)
        ours = train_sdp(from_hf_model(hf_model()), level, hf=False)
        diff = max((theirs["state"][k] - ours["state"][k]).abs().max().item() for k in ours["state"])
        out[level] = {"hf_losses": theirs["losses"], "slimpar_losses": ours["losses"],
                      "same_mask": theirs["mask"] == ours["mask"], "names_equal": set(theirs["state"]) == set(
                          ours["state"]), "max_param_diff": diff}
    out["pipeline_losses"] = train_pipeline()
    out["reference_losses"] = hf_reference()
    # one file per rank: two ranks printing to torchrun's shared stdout can interleave within a line
    Path(f"rank{out['rank']}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
