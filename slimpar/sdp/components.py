"""Maskable components of a model for Subnetwork Data Parallelism (docs/methods.md, 'Components').

A component is the unit that a mask column switches on or off on a worker:
- block level (B-SDP): one whole residual block (``layers.3``, ``blocks.5``);
- neuron level (N-SDP): a contiguous group of hidden units of one block. For a SwiGLU FFN unit h
  is row h of w1 and w3 and column h of w2; for a ResNet BasicBlock channel h is out-channel h of
  conv1, bn1[h] (weight, bias, running stats) and in-channel h of conv2.

Everything that is not in a component (embeddings, head, norms on the residual stream, attention
at neuron level, stems, non-maskable blocks) is *shared*: held and averaged by every worker.
Tied parameters are counted once (``named_parameters`` de-duplicates them; the first name wins).
Extraction is duck-typed and pure: it reads module structure and shapes, never communicates.
"""

from __future__ import annotations

import torch
from torch import nn

from slimpar.sdp.extraction import (
    Component,
    Extraction,
    Level,
    Pairs,
    PlanError,
    attention_flops,
    block_component,
    block_dict,
    canonical_params,
    maskable,
    neuron_component,
    split_units,
    with_shared,
)

__all__ = ["Component", "PlanError", "Level", "llama_components", "resnet_components", "swin_components",
           "path_components", "model_components", "conv_positions", "split_units"]


def llama_components(model: nn.Module, level: Level = "block", groups: int = 4) -> Extraction:
    """Components of a LLaMA-style model with blocks in ``model.layers`` (ModuleDict).

    block: one component per maskable ``layers.{i}``. neuron: per layer, ``groups`` contiguous
    groups of the SwiGLU hidden units ("layers.{i}.ffn.g{j}"), owning rows of
    ``feed_forward.w1``/``w3`` and columns of ``feed_forward.w2``. Returns (components, shared
    parameter names, shared bytes).
    """
    block_dict(model, "layers")
    return path_components(model, "layers", level, groups)


def conv_positions(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, int]:
    """Output positions (H x W) of every Conv2d for one input of ``input_shape``, found by a
    no-grad forward in eval mode (running statistics untouched; the training flag is restored)."""
    positions: dict[str, int] = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Conv2d):
            def record(_m: nn.Module, _inp: tuple, out: torch.Tensor, name: str = name) -> None:
                positions[name] = int(out.shape[-1] * out.shape[-2])
            hooks.append(mod.register_forward_hook(record))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(input_shape, device=next(model.parameters()).device))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return positions


def blocks_components(model: nn.Module, attr: str = "blocks",
                      positions: dict[str, int] | None = None) -> Extraction:
    """Block-level components of a model whose blocks sit in ``model.<attr>`` (ModuleDict); blocks
    whose ``maskable`` attribute is False (stems, downsampling stages) stay shared."""
    comps = [block_component(model, f"{attr}.{key}", positions=positions)
             for key, block in block_dict(model, attr).items() if maskable(block)]
    return with_shared(model, comps)


_CHANNEL_PARAMS = (("conv1.weight", 0), ("conv1.bias", 0), ("bn1.weight", 0), ("bn1.bias", 0),
                   ("conv2.weight", 1))


def _resnet_neuron_pairs(model: nn.Module, prefix: str) -> tuple[Pairs, Pairs]:
    """(param, axis) and (buffer, axis) pairs that channel h of a BasicBlock's inner width touches."""
    params, buffers = canonical_params(model), dict(model.named_buffers())
    p_pairs = [(f"{prefix}.{n}", d) for n, d in _CHANNEL_PARAMS if f"{prefix}.{n}" in params]
    b_pairs = [(f"{prefix}.bn1.{n}", 0) for n in ("running_mean", "running_var")
               if f"{prefix}.bn1.{n}" in buffers]
    return p_pairs, b_pairs


def resnet_components(model: nn.Module, level: Level = "block", groups: int = 4,
                      input_shape: tuple[int, ...] | None = None) -> Extraction:
    """ResNet components from ``model.blocks`` (ModuleDict of blocks with ``maskable``).

    block: one component per maskable block. neuron: per maskable BasicBlock, ``groups`` groups of
    its inner channels ("blocks.{i}.ch.g{j}"): conv1 out-channels, bn1, conv2 in-channels; the
    shortcut, conv2 out-channels and bn2 stay shared. FLOPs are per image when ``input_shape``
    (e.g. (1, 3, 32, 32)) is given, else per output position.
    """
    positions = conv_positions(model, input_shape) if input_shape is not None else None
    if level == "block":
        return blocks_components(model, "blocks", positions)
    if level != "neuron":
        raise PlanError(f"unknown component level {level!r}; choose 'block' or 'neuron'")
    comps: list[Component] = []
    for key, block in block_dict(model, "blocks").items():
        if not maskable(block):
            continue
        if not all(hasattr(block, m) for m in ("conv1", "bn1", "conv2")):
            raise PlanError(f"blocks.{key} is maskable but has no conv1/bn1/conv2 for channel masking")
        prefix = f"blocks.{key}"
        p_pairs, b_pairs = _resnet_neuron_pairs(model, prefix)
        for g, idx in enumerate(split_units(block.conv1.weight.shape[0], groups)):
            name = f"{prefix}.ch.g{g}"
            comps.append(neuron_component(model, prefix, name, idx, p_pairs, b_pairs, positions))
    return with_shared(model, comps)


def swin_components(model: nn.Module) -> Extraction:
    """Block-level components of a Swin-style model (``model.blocks`` ModuleDict, ``maskable``);
    FLOPs are 2 x weight elements per token (window-attention scores left out)."""
    return blocks_components(model, "blocks")


def _block_items(model: nn.Module, blocks: str) -> list[tuple[str, nn.Module]]:
    """(key, block) of the container at ``blocks`` (an ``nn.ModuleList`` or ``nn.ModuleDict``)."""
    try:
        container = model.get_submodule(blocks)
    except AttributeError:
        raise PlanError(f"{type(model).__name__} has no submodule {blocks!r} (blocks=...)") from None
    if not isinstance(container, (nn.ModuleList, nn.ModuleDict)):
        raise PlanError(f"{blocks!r} is a {type(container).__name__}; blocks must name an nn.ModuleList or "
                        "nn.ModuleDict of repeated blocks")
    return list(container.items()) if isinstance(container, nn.ModuleDict) else \
        [(str(i), b) for i, b in enumerate(container)]


# SwiGLU MLP layouts: (gate, up, down) attribute names. Hidden unit h is row h of gate and up, column h of down.
SWIGLU_LAYOUTS = (("w1", "w3", "w2"),  # slimpar's FeedForward
                  ("gate_proj", "up_proj", "down_proj"))  # Hugging Face LLaMA, Mistral, Qwen2


def _swiglu(block: nn.Module, prefix: str) -> tuple[Pairs, int] | None:
    """The (param, axis) pairs and width of the SwiGLU MLP inside ``block``, if it has one."""
    for path, mod in block.named_modules():
        for gate, up, down in SWIGLU_LAYOUTS:
            if all(isinstance(getattr(mod, n, None), nn.Linear) for n in (gate, up, down)):
                base = f"{prefix}.{path}" if path else prefix
                if any(getattr(mod, n).bias is not None for n in (gate, up, down)):
                    raise PlanError(f"{base}: SwiGLU projections with biases are not supported at neuron level")
                pairs = [(f"{base}.{gate}.weight", 0), (f"{base}.{up}.weight", 0), (f"{base}.{down}.weight", 1)]
                return pairs, getattr(mod, gate).weight.shape[0]
    return None


def path_components(model: nn.Module, blocks: str, level: Level = "block", groups: int = 4) -> Extraction:
    """Components of any model whose repeated blocks sit at the dotted path ``blocks``.

    block: one component per block (``{blocks}.{i}``). neuron: ``groups`` groups of each block's
    SwiGLU hidden units (slimpar's w1/w3/w2 or HF's gate_proj/up_proj/down_proj, found anywhere
    inside the block, e.g. ``model.layers.3.mlp``), named ``{blocks}.{i}.ffn.g{j}``.
    """
    comps: list[Component] = []
    for key, block in _block_items(model, blocks):
        if not maskable(block):
            continue
        prefix = f"{blocks}.{key}"
        if level == "block":
            comps.append(block_component(model, prefix, extra_flops=attention_flops(model)))
            continue
        if level != "neuron":
            raise PlanError(f"unknown component level {level!r}; choose 'block' or 'neuron'")
        found = _swiglu(block, prefix)
        if found is None:
            raise PlanError(f"{prefix} has no SwiGLU MLP ({' / '.join('/'.join(t) for t in SWIGLU_LAYOUTS)}) "
                            "to split at neuron level")
        pairs, d_ff = found
        for g, idx in enumerate(split_units(d_ff, groups)):
            comps.append(neuron_component(model, prefix, f"{prefix}.ffn.g{g}", idx, pairs, []))
    return with_shared(model, comps)


def model_components(model: nn.Module, level: Level = "block", groups: int = 4, blocks: str | None = None,
                     **kw) -> Extraction:
    """Dispatch by structure: ``blocks`` (a dotted path) -> :func:`path_components`; ``.layers`` -> LLaMA;
    ``.blocks`` with conv1 -> ResNet; ``.blocks`` -> Swin (block level only); a Hugging Face causal LM's
    ``model.layers`` -> :func:`path_components`."""
    if blocks is not None:
        return path_components(model, blocks, level, groups)
    if isinstance(getattr(model, "layers", None), nn.ModuleDict):
        return llama_components(model, level, groups)
    blocks_dict = getattr(model, "blocks", None)
    if isinstance(blocks_dict, nn.ModuleDict):
        if any(hasattr(b, "conv1") for b in blocks_dict.values()):
            return resnet_components(model, level, groups, **kw)
        if level != "block":
            raise PlanError(f"{type(model).__name__}: neuron-level components are supported for LLaMA "
                            "FFNs and ResNet BasicBlocks only")
        return swin_components(model)
    inner = getattr(model, "model", None)
    if isinstance(getattr(inner, "layers", None), (nn.ModuleList, nn.ModuleDict)):
        return path_components(model, "model.layers", level, groups)
    raise PlanError(f"{type(model).__name__} has neither a `layers` nor a `blocks` nn.ModuleDict; pass the "
                    "path of its repeated blocks, e.g. blocks=\"model.layers\"")
