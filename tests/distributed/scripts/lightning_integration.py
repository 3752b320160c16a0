"""PyTorch Lightning with SDP (slimpar.integrations.lightning.SDPStrategy) under torchrun with 2 gloo ranks, next to
Lightning's own DDPStrategy and on exactly the batches of a ``slimpar train`` run.

argv: work folder, a Hugging Face LLaMA folder, a JSON file with that run's ``slimpar train`` overrides (of
configs/llama_tiny.toml). A LightningModule holds the folder's LlamaForCausalLM as ``self.model``. One epoch is
one optimizer step: epoch s reads step s of the run (its dataloader is reloaded every epoch), and micro-batch m
of rank r is the run's share r·M + m, laid out for a DistributedSampler without shuffling (row i goes to rank
i mod 2). An epoch per step also puts the checkpoint that is resumed at an epoch's end: Lightning restarts a
mid-epoch resume at the epoch's first batch unless the loader is stateful, with any strategy. Optimizer,
schedule (per step), clipping and accumulation are the run's. Each rank writes ``lightning{r}.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, DistributedSampler
from transformers import LlamaForCausalLM
from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

from slimpar.integrations.lightning import SDPArguments, SDPStrategy
from tests.distributed.scripts.integration_common import WORLD, Rows, max_diff, row, run_config, shares

WORK, HF = Path(sys.argv[1]), sys.argv[2]
CFG = run_config(sys.argv[3])
T = CFG.train
MICRO = T.batch_size // (WORLD * T.grad_accum)
SHARES = shares(CFG)


def step_rows(step: int) -> list[dict]:
    """Step ``step``'s rows; a DistributedSampler without shuffling deals row i to rank i mod 2."""
    return [row(SHARES[step, micro, r][k]) for micro in range(T.grad_accum) for k in range(MICRO)
            for r in range(WORLD)]


VAL = step_rows(0)[:8]


class Lit(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = LlamaForCausalLM.from_pretrained(HF)
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = self.model(**batch).loss
        self.losses.append(float(loss))
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.model(**batch).loss, sync_dist=True)

    def configure_optimizers(self):
        decay = [p for p in self.parameters() if p.dim() >= 2]
        rest = [p for p in self.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": T.weight_decay},
                                 {"params": rest, "weight_decay": 0.0}], lr=T.lr, betas=(T.beta1, T.beta2), eps=1e-8)
        sched = get_cosine_with_min_lr_schedule_with_warmup(opt, 0, T.steps, min_lr_rate=T.min_lr_ratio)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self):
        rows = Rows(step_rows(self.current_epoch))
        return DataLoader(rows, batch_size=MICRO, sampler=DistributedSampler(rows, WORLD, self.global_rank, False))

    def val_dataloader(self):
        rows = Rows(VAL)
        return DataLoader(rows, batch_size=4, sampler=DistributedSampler(rows, WORLD, self.global_rank, False))


def fit(strategy, ckpt_path: str | None = None, callbacks=()) -> tuple[L.Trainer, Lit]:
    lit = Lit()
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=WORLD, max_epochs=T.steps,
                        reload_dataloaders_every_n_epochs=1, use_distributed_sampler=False,
                        check_val_every_n_epoch=T.steps, accumulate_grad_batches=T.grad_accum,
                        gradient_clip_val=T.grad_clip, logger=False, enable_checkpointing=bool(callbacks),
                        callbacks=list(callbacks), enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(lit, ckpt_path=ckpt_path)
    return trainer, lit


def step_losses(lit: Lit) -> list[float]:
    """Each step's loss, the mean over its micro-batches and over the ranks (as slimpar logs it)."""
    per_rank = torch.tensor(lit.losses).view(-1, T.grad_accum).mean(1)
    dist.all_reduce(per_rank)
    return (per_rank / WORLD).tolist()


def main() -> None:
    out = {}
    _, ddp = fit(DDPStrategy(process_group_backend="gloo"))
    _, sdp1 = fit(SDPStrategy(SDPArguments(keep=1.0, check_every=1), process_group_backend="gloo"))
    out["ddp"], out["sdp1"] = ddp.losses, sdp1.losses  # this rank's micro-batch losses
    ckpt = ModelCheckpoint(dirpath=WORK / "lightning_ckpt", every_n_epochs=1, save_top_k=-1, save_last=True,
                           save_on_train_epoch_end=True)
    half_trainer, half = fit(SDPStrategy(SDPArguments(keep=0.5, check_every=1), process_group_backend="gloo"),
                             callbacks=[ckpt])
    out["sdp05"] = step_losses(half)
    out["val_loss"] = float(half_trainer.callback_metrics["val_loss"])
    full = {k: v.detach().clone() for k, v in half_trainer.strategy.full_network().state_dict().items()}
    ids = torch.stack([r["input_ids"] for r in VAL])
    with torch.no_grad():
        out["val_direct"] = float(half_trainer.strategy.full_network()(input_ids=ids, labels=ids).loss)
    out["held_blocks"] = len([n for n, _ in half.model.named_parameters() if n.endswith("input_layernorm.weight")])
    resumed_trainer, resumed = fit(SDPStrategy(SDPArguments(keep=0.5), process_group_backend="gloo"),
                                   ckpt_path=str(WORK / "lightning_ckpt" / "epoch=2-step=3.ckpt"))
    out["resumed"] = step_losses(resumed)
    out["resume_param_diff"] = max_diff(full, resumed_trainer.strategy.full_network().state_dict())
    loaded = Lit.load_from_checkpoint(str(WORK / "lightning_ckpt" / "last.ckpt"))
    out["load_diff"] = max_diff(full, loaded.model.state_dict())
    (WORK / f"lightning{dist.get_rank()}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
