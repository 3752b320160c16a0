"""Pipeline checkpoints that reshard to another stage count (``layout.json``: ``"names": "pipeline-full"``).

Save: each rank's stage state dicts (DCP's ``get_state_dict``, optimizer flattened by parameter name) are
renamed by :func:`slimpar.pipeline.names.saved_name`: model weights under the full model's names
(``layers.3.…``, the same for every stage count, virtual or not), codec halves under the block of their cut
(``codecs.cut{b}.send.…`` / ``.recv.…``). Replicas of a stage (and the holders of a block in the hybrid)
write the same names with the same values; DCP's planner keeps one copy.

Load (every rank, collective):
  1. the checkpoint's cuts: ``layout.json`` (``pipeline.cuts``), else the ``codecs.cut{b}`` names in DCP's metadata;
     a cut of this run that the checkpoint also has is **kept**, any other is **restarted** (a new cut);
  2. this rank's state dicts under checkpoint names (``get_state_dict`` first initialises the optimizer state
     with a zero-gradient step; the restarted halves' fresh values are saved before and put back after);
  3. DCP reads every model weight, kept codec tensor and their optimizer entries by name (each new stage
     the blocks it now holds); a model weight the checkpoint lacks is an error;
  4. ``set_state_dict``; the restarted halves get their fresh values back and no optimizer state (their first
     step starts AdamW/SPEL afresh, as a new run's would). The strategy runs a PCA start for them
     (``projector_init = "pca"``) before the first resumed step, keeping the A of every kept cut.
Rank 0 prints one line per boundary when the layout changed; :attr:`PipelineCheckpoint.report` feeds summary.json.

Checkpoints of an older slimpar (``"names": "pipeline"``: stage-local names) load through DCP as before,
only into the same layout (:func:`slimpar.train.checkpoint.layout.check_layout` refuses the rest).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from slimpar.pipeline.names import cut_blocks, cut_of, saved_name, saved_optim_name
from slimpar.pipeline.split import StageModule
from slimpar.train.checkpoint.safe_dcp import dcp_load, read_dcp_metadata

FORMAT, LEGACY = "pipeline-full", "pipeline"


def checkpoint_cuts(path: Path) -> tuple[str, list[int] | None, int | None]:
    """(format, cuts, stages) of the pipeline checkpoint at ``path``; cuts/stages None where unknown."""
    f = Path(path) / "layout.json"
    layout = json.loads(f.read_text()) if f.is_file() else {}
    tied = layout.get("pipeline", {})
    keys = read_dcp_metadata(Path(path) / ".metadata").state_dict_metadata
    names = layout.get("names") or (LEGACY if any(k.startswith(("model.model.", "model.stage")) for k in keys)
                                    else FORMAT)
    cuts = tied.get("cuts")
    if cuts is None and names == FORMAT:
        found = {cut_of(k[len("model."):]) for k in keys if k.startswith("model.codecs.cut")}
        cuts = sorted(found) or None  # stateless codecs (none, bf16, int8) name no cut
    return names, cuts, tied.get("stages")


def saved_rank(path: Path) -> int | None:
    """The r of the projectors a checkpoint's codecs hold (A is (d, r)), read from its DCP metadata through the
    safe reader; None where no codec has a projector (or the checkpoint has no metadata)."""
    meta = Path(path) / ".metadata"
    if not meta.is_file():
        return None
    keys = read_dcp_metadata(meta).state_dict_metadata
    ranks = {tuple(v.size)[1] for k, v in keys.items() if k.startswith("model.codecs.cut")
             and k.endswith(".projector.A") and len(getattr(v, "size", ())) == 2}
    return min(ranks) if ranks else None  # every boundary has the same r (one spec for all)


def _with_prefixes(keys) -> set[str]:
    """DCP's metadata keys and every dotted prefix of them: DCP flattens a nested non-tensor value (an RVQ's
    extra state dict) into one key per leaf, so an entry is present when its name is a prefix of some key."""
    out = set()
    for k in keys:
        parts = k.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


class PipelineCheckpoint:
    """What the trainer hands to ``save_checkpoint`` / ``load_checkpoint`` for a pipeline run."""

    def __init__(self, module: nn.Module, stages: list[StageModule], num_stages: int, codec: str, options):
        self.module, self.stages, self.options, self.codec = module, stages, options, codec
        self.num_stages = num_stages
        self.cuts = cut_blocks(stages[0].model.cfg.n_layers, num_stages)
        self.restarted: set[int] = set()
        self.report: dict | None = None  # after a load: what was kept and restarted (summary.json)

    # ------------------------------------------------------------------- save
    def state_to_save(self, optimizer) -> tuple[dict, dict]:
        """This rank's state dicts under stage-count-free names (pipeline/names.py)."""
        model_sd, optim_sd = get_state_dict(self.module, optimizer, options=self.options)
        return ({saved_name(k, self.cuts): v for k, v in model_sd.items()},
                {saved_optim_name(k, self.cuts): v for k, v in optim_sd.items()})

    # ------------------------------------------------------------------- load
    def load_from(self, path: Path, optimizer, group=None) -> None:
        """Load the checkpoint at ``path`` into this rank's stages (algorithm: module docstring)."""
        names, old_cuts, old_stages = checkpoint_cuts(path)
        if names == LEGACY:
            model_sd, optim_sd = get_state_dict(self.module, optimizer, options=self.options)
            state = {"model": model_sd, "optim": optim_sd}
            dcp_load(state, path, group)
            set_state_dict(self.module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                           options=self.options)
            self._record(self.cuts, old_stages or self.num_stages, True)
            return
        old = self.cuts if old_cuts is None else old_cuts  # a stateless codec: nothing to keep or restart
        self.restarted = set(self.cuts) - set(old)
        fresh = {half: copy.deepcopy(half.state_dict()) for half in self._halves(self.restarted)}
        model_sd, optim_sd = get_state_dict(self.module, optimizer, options=self.options)
        keys = _with_prefixes(read_dcp_metadata(Path(path) / ".metadata").state_dict_metadata)
        state = {"model": self._wanted(model_sd, saved_name, "model", keys, path),
                 "optim": self._wanted(optim_sd, saved_optim_name, "optim", keys, path)}
        dcp_load(state, path, group)
        for part, sd, rename in (("model", model_sd, saved_name), ("optim", optim_sd, saved_optim_name)):
            for k in sd:
                if rename(k, self.cuts) in state[part]:
                    sd[k] = state[part][rename(k, self.cuts)]  # non-tensors are replaced, not copied into
        set_state_dict(self.module, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                       options=self.options)
        for half, values in fresh.items():
            half.load_state_dict(values)
            for p in half.parameters():
                optimizer.state.pop(p, None)
        self._record(old, old_stages or len(old) + 1, old_cuts is not None)

    def _wanted(self, sd: dict, rename, part: str, keys, path: Path) -> dict:
        """``sd`` under checkpoint names, without the restarted cuts; raises if the checkpoint lacks an entry."""
        out = {rename(k, self.cuts): v for k, v in sd.items()}
        out = {k: v for k, v in out.items() if cut_of(k) not in self.restarted}
        missing = sorted(k for k in out if f"{part}.{k}" not in keys)
        if missing:
            raise ValueError(f"{path} does not hold {part} entries this pipeline needs: {', '.join(missing[:4])}"
                             f"{' …' if len(missing) > 4 else ''} ({len(missing)} in all)")
        return out

    def _halves(self, cuts: set[int]) -> list[nn.Module]:
        """This rank's codec halves (encoder and decoder modules) at the given cut blocks."""
        out = []
        for s in self.stages:
            for name, half in s.codecs.items():
                if self.cuts[int(name[4:])] in cuts:  # "send{p}" / "recv{p}"
                    out.append(half)
        return out

    def _record(self, old_cuts: list[int], old_stages: int, stateful: bool) -> None:
        """``report`` for summary.json; rank 0 prints a line per boundary when the layout changed."""
        state = {b: "restarted" if b in self.restarted else "kept" if stateful else "none" for b in self.cuts}
        bounds = [{"after_block": b, "codec_state": state[b]} for b in self.cuts]
        dropped = sorted(set(old_cuts) - set(self.cuts))
        self.report = {"checkpoint_stages": old_stages, "stages": self.num_stages, "boundaries": bounds,
                       "dropped_cuts": dropped}
        if old_stages == self.num_stages and not dropped and not self.restarted:
            return
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        print(f"resharding the pipeline checkpoint: {old_stages} stages -> {self.num_stages}; model weights and "
              "their optimizer state load by name (each stage takes the blocks it now holds)", flush=True)
        for b in bounds:
            what = {"kept": "codec state kept", "restarted": "codec state restarted (new cut)",
                    "none": f"no codec state (codec {self.codec})"}[b["codec_state"]]
            print(f"boundary after block {b['after_block']}: {what}", flush=True)
        for b in dropped:
            print(f"boundary after block {b}: no longer a cut (its codec state is not used)", flush=True)
