"""Names of a pipeline's state that do not depend on its stage count (checkpoints that reshard).

A stage module names its tensors ``model.<full-model name>`` (blocks keep the full model's ``layers.<i>``,
split.py) and ``codecs.send{p}.*`` / ``codecs.recv{p}.*`` for the two halves of boundary p; the virtual
pipeline prefixes each stage's names with ``stage{s}.``. The stage prefix and the boundary index p depend
on the stage count, so a checkpoint stores instead

    <full-model name>                 e.g. ``layers.3.attention.wq.weight``, ``tok_embeddings.weight``
    codecs.cut{b}.send.* / .recv.*    b = the block after which boundary p falls (the last block of stage p)

A cut is identified by its block: a 4-stage and a 2-stage pipeline of 4 blocks share the cut after block 1,
so its codec state carries over, and the cuts after blocks 0 and 2 exist only in the 4-stage layout.
The mapping is a pure function of (name, stage count, block count); it applies to flattened optimizer keys
too (``state.<name>.exp_avg``, ``param_groups.<name>.lr``), which name their parameter the same way.
"""

from __future__ import annotations

import re

from slimpar.pipeline.split import stage_ranges

_STAGE = re.compile(r"^stage(\d+)\.")
_CODEC = re.compile(r"^codecs\.(send|recv)(\d+)\.")
_CUT = re.compile(r"^codecs\.cut(\d+)\.")
_OPTIM = ("state.", "param_groups.")


def cut_blocks(n_layers: int, stages: int) -> list[int]:
    """The block after which each of the ``stages`` − 1 boundaries falls (the last block of stage p)."""
    return [r[-1] for r in stage_ranges(n_layers, stages)[:-1]]


def saved_name(name: str, cuts: list[int]) -> str:
    """A stage (or virtual pipeline) state-dict name -> its stage-count-free checkpoint name.

    ``cuts`` = :func:`cut_blocks` of the run. ``stage{s}.`` goes, ``model.`` goes, and boundary p's
    codec halves become ``codecs.cut{cuts[p]}.send`` / ``.recv``."""
    name = _STAGE.sub("", name, count=1)
    if name.startswith("model."):
        return name[len("model."):]
    m = _CODEC.match(name)
    if m:
        return f"codecs.cut{cuts[int(m.group(2))]}.{m.group(1)}.{name[m.end():]}"
    return name


def saved_optim_name(key: str, cuts: list[int]) -> str:
    """:func:`saved_name` for a flattened optimizer key (``state.<name>.<stat>``, ``param_groups.<name>.<key>``)."""
    for head in _OPTIM:
        if key.startswith(head):
            return head + saved_name(key[len(head):], cuts)
    return key


def cut_of(name: str) -> int | None:
    """The cut block of a checkpoint name (``codecs.cut{b}.*``, optimizer keys too); None for model weights."""
    for head in _OPTIM:
        if name.startswith(head):
            name = name[len(head):]
            break
    m = _CUT.match(name)
    return int(m.group(1)) if m else None
