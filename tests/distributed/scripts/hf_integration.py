"""transformers.Trainer and an Accelerate loop with SDP (slimpar.integrations), under torchrun with 2 gloo ranks,
next to the same stacks' own DDP and on exactly the batches of a ``slimpar train`` run.

argv: work folder, a Hugging Face LLaMA folder, a JSON file with that run's ``slimpar train`` overrides (of
configs/llama_tiny.toml). Every run starts from the folder's weights and reads slimpar's batches: step s,
micro-batch m of rank r is slimpar's share r·M + m of step s (tokens T + 1 wide: HF shifts labels itself, so
its T predictions are slimpar's T targets), dealt in the order Accelerate shards a sequential loader. AdamW,
weight decay on matrices, clipping, the cosine schedule to a floor and gradient accumulation are set as
slimpar's run sets them. Each rank writes its results to ``rank{r}.json`` in the work folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

from slimpar.integrations.common import SDPArguments, wrap_model
from slimpar.integrations.hf import SDPTrainer
from slimpar.sdp import plan_blocks
from slimpar.sdp.wrapper import SubnetworkDataParallel
from tests.distributed.scripts.integration_common import WORLD, Rows, max_diff, row, run_config, shares

WORK, HF = Path(sys.argv[1]), sys.argv[2]
CFG = run_config(sys.argv[3])
T = CFG.train
MICRO = T.batch_size // (WORLD * T.grad_accum)  # sequences per rank and micro-batch
# Accelerate deals a sequential loader's per-rank batches round robin: batch j goes to rank j mod 2
ROWS = [row(ids) for (_, _, _), block in sorted(shares(CFG).items()) for ids in block]


class Log(TrainerCallback):
    """Trainer's logged loss (mean over ranks) and gradient norm, every step."""

    def __init__(self):
        self.loss: list[float] = []
        self.grad_norm: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.loss.append(logs["loss"])
            self.grad_norm.append(float(logs["grad_norm"]))


def trainer_args(name: str, **kw) -> TrainingArguments:
    settings = dict(
        output_dir=str(WORK / name), per_device_train_batch_size=MICRO, gradient_accumulation_steps=T.grad_accum,
        max_steps=T.steps, learning_rate=T.lr, weight_decay=T.weight_decay, adam_beta1=T.beta1, adam_beta2=T.beta2,
        adam_epsilon=1e-8, max_grad_norm=T.grad_clip, lr_scheduler_type="cosine_with_min_lr", warmup_steps=0,
        lr_scheduler_kwargs={"min_lr_rate": T.min_lr_ratio}, logging_steps=1, report_to=[], disable_tqdm=True,
        use_cpu=True, train_sampling_strategy="sequential", ddp_backend="gloo", save_strategy="no")
    return TrainingArguments(**(settings | kw))


def run_trainer(name: str, sdp: SDPArguments | None = None, resume: str | None = None, wrapped: bool = False, **kw):
    """Trainer (``sdp`` None), or SDPTrainer given the full model and ``sdp``, or (``wrapped``) given the model the
    user wrapped in slimpar.SubnetworkDataParallel, as the issue's Trainer user did."""
    log = Log()
    model = LlamaForCausalLM.from_pretrained(HF)
    if wrapped:
        model = SubnetworkDataParallel(model, plan_blocks(model, WORLD, sdp.keep))
    common = dict(model=model, args=trainer_args(name, **kw), train_dataset=Rows(ROWS), eval_dataset=Rows(ROWS[:8]),
                  callbacks=[log])
    trainer = Trainer(**common) if sdp is None else SDPTrainer(**common, sdp=sdp)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, log


def trainer_results() -> dict:
    out = {}
    _, out["ddp"] = run_trainer("ddp")
    _, out["sdp1"] = run_trainer("sdp1", SDPArguments(keep=1.0, check_every=1), wrapped=True)
    # keep 0.5 with checkpoints at steps 3 and 5 and a mid-run evaluation, then resumed from step 3
    half, out["sdp05"] = run_trainer("sdp05", SDPArguments(keep=0.5, check_every=1), save_strategy="steps",
                                     save_steps=3, eval_strategy="steps", eval_steps=2)
    resumed, out["resumed"] = run_trainer("sdp05", SDPArguments(keep=0.5), save_strategy="steps", save_steps=3,
                                          resume=str(WORK / "sdp05" / "checkpoint-3"))
    full = {k: v.detach() for k, v in half.full_model().state_dict().items()}
    res = {k: {"loss": out[k].loss, "grad_norm": out[k].grad_norm} for k in ("ddp", "sdp1", "sdp05", "resumed")}
    res["resume_param_diff"] = max_diff(full, resumed.full_model().state_dict())
    res["plan_mask"] = half.sdp.plan.mask.tolist()
    res["held_blocks"] = sum(1 for n, _ in half.model.named_parameters() if n.endswith("input_layernorm.weight"))
    res.update(saved_and_evaluated(half, full))
    return res


def saved_and_evaluated(trainer: SDPTrainer, full: dict) -> dict:
    """save_model writes the full model; from_pretrained loads it; evaluate() scores it (against a direct count)."""
    trainer.save_model(str(WORK / "sdp05_final"))
    dist.barrier()
    loaded = LlamaForCausalLM.from_pretrained(str(WORK / "sdp05_final"))
    metrics = trainer.evaluate()
    ids = torch.stack([r["input_ids"] for r in ROWS[:8]])
    with torch.no_grad():
        direct = float(loaded(input_ids=ids, labels=ids).loss)
    return {"from_pretrained_diff": max_diff(full, loaded.state_dict()), "eval_loss": metrics["eval_loss"],
            "eval_direct": direct, "saved_layers": loaded.config.num_hidden_layers,
            "loaded_layers": len(loaded.model.layers)}


def accelerate_run(sdp: SDPArguments | None) -> list[float]:
    """The loop of docs/integrations.md: accumulate, clip, schedule per optimizer step. Returns the mean loss
    over ranks of each step."""
    accelerator = Accelerator(gradient_accumulation_steps=T.grad_accum)
    model = LlamaForCausalLM.from_pretrained(HF)
    if sdp is not None:
        model = wrap_model(model, sdp)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": T.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=T.lr, betas=(T.beta1, T.beta2), eps=1e-8)
    sched = get_cosine_with_min_lr_schedule_with_warmup(opt, 0, T.steps, min_lr_rate=T.min_lr_ratio)
    loader = DataLoader(Rows(ROWS), batch_size=MICRO)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    losses, step_loss = [], 0.0
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            step_loss += float(loss) / T.grad_accum
            if accelerator.sync_gradients:
                if sdp is not None:
                    model.sync()
                    model.clip_grad_norm_(T.grad_clip)
                else:
                    accelerator.clip_grad_norm_(model.parameters(), T.grad_clip)
            opt.step()
            opt.zero_grad()
            if accelerator.sync_gradients:
                sched.step()
                losses.append(float(accelerator.reduce(torch.tensor(step_loss), "mean")))
                step_loss = 0.0
    return losses


def plain_trainer_refused() -> str:
    """An SDP module handed to the plain Trainer: its forward refuses the second step (sync never called)."""
    model = wrap_model(LlamaForCausalLM.from_pretrained(HF), SDPArguments(keep=0.5))
    args = trainer_args("plain", max_steps=2, remove_unused_columns=False)  # the wrapper's forward takes **kwargs
    trainer = Trainer(model=model, args=args, train_dataset=Rows(ROWS))
    try:
        trainer.train()
    except RuntimeError as e:
        return str(e)
    return ""


def main() -> None:
    results = {"trainer": trainer_results()}
    results["accelerate"] = {"ddp": accelerate_run(None), "sdp1": accelerate_run(SDPArguments(keep=1.0)),
                             "sdp05": accelerate_run(SDPArguments(keep=0.5))}
    results["plain_trainer_error"] = plain_trainer_refused()
    (WORK / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
