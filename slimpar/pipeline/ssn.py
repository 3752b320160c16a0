"""Subspace Networks (SSN) baseline: constrain a LLaMA so its residual stream lives in span(U) + F[t].

Ramasinghe et al., arXiv 2506.01260; reference code ProtocolNanoGPT ``train_gpt_ssn.py`` (ReparamSSN)
— docs/methods.md, 'Baselines'. One global U ∈ St(d, k) and one frozen random
token table F ∈ ℝ^{V×d}, both derived from the seed, so no rank sends them:

- every residual branch's output projection (attention ``wo`` and FFN ``w2``) is reparametrised as
  W = U W′ with W′ ∈ ℝ^{k×in} trainable, so each block adds a vector of span(U);
- the token embedding becomes E[t] = E_k[t] Uᵀ + F[t] with E_k ∈ ℝ^{V×k} trainable;
- the last block stays full rank (its output never crosses a boundary).
Then h − F[t] ∈ span(U) after every constrained block, a boundary sends c = Uᵀ(h − F[t]) (k numbers)
and the receiver rebuilds ĥ = Uc + F[t] = h exactly (up to rounding). Reparametrising, instead of
projecting AdamW's updates back into span(U), keeps the optimizer unchanged (ReparamSSN's choice).

Starting values: W′ = Uᵀ W₀ and E_k = E₀ U, the projections of the model's own initial weights.
``effective_state_dict`` turns a stage back into plain LLaMA weights (W = U W′, E = E_k Uᵀ + F).
"""

from __future__ import annotations

from torch import Tensor, nn

from slimpar.codecs.anchors import ssn_token_table
from slimpar.codecs.projector import ssn_basis


class SubspaceLinear(nn.Module):
    """y = (x W′ᵀ) Uᵀ: a bias-free linear layer whose outputs lie in span(U). W′ (k, in), U (d, k)."""

    def __init__(self, weight: Tensor, U: Tensor):
        super().__init__()
        self.register_buffer("U", U, persistent=False)  # shared, seed-derived: not checkpointed
        self.weight = nn.Parameter((U.t() @ weight.detach()).contiguous())  # (k, in)

    def forward(self, x: Tensor) -> Tensor:
        return (x @ self.weight.t()) @ self.U.t()  # (..., k) -> (..., d)

    def effective_weight(self) -> Tensor:
        return self.U @ self.weight  # (d, in), the nn.Linear weight it equals


class SubspaceEmbedding(nn.Module):
    """E[t] = E_k[t] Uᵀ + F[t] with E_k (V, k) trainable, U (d, k) and F (V, d) frozen."""

    def __init__(self, weight: Tensor, U: Tensor, table: Tensor):
        super().__init__()
        self.register_buffer("U", U, persistent=False)
        self.register_buffer("F", table, persistent=False)
        self.weight = nn.Parameter((weight.detach() @ U).contiguous())  # (V, k)

    def forward(self, ids: Tensor) -> Tensor:
        return self.weight[ids] @ self.U.t() + self.F[ids]  # (..., d)

    def effective_weight(self) -> Tensor:
        return self.weight @ self.U.t() + self.F  # (V, d)


def ssn_tensors(d: int, k: int, vocab: int, seed: int, std: float) -> tuple[Tensor, Tensor]:
    """(U (d, k), F (V, d)): the run's SSN subspace and token table, identical on every rank."""
    return ssn_basis(d, k, seed), ssn_token_table(vocab, d, seed, std)


def apply_ssn(model: nn.Module, U: Tensor, table: Tensor) -> nn.Module:
    """Reparametrise a full Llama in place (before it is split into stages); returns it."""
    names = list(model.layers.keys())
    for name in names[:-1]:  # the last block stays full rank
        block = model.layers[name]
        block.attention.wo = SubspaceLinear(block.attention.wo.weight, U)
        block.feed_forward.w2 = SubspaceLinear(block.feed_forward.w2.weight, U)
    model.tok_embeddings = SubspaceEmbedding(model.tok_embeddings.weight, U, table)
    return model


def effective_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """``module.state_dict()`` with every SSN layer replaced by the plain weight it computes."""
    out = {k: v for k, v in module.state_dict().items()}
    for name, sub in module.named_modules():
        if isinstance(sub, (SubspaceLinear, SubspaceEmbedding)):
            out[f"{name}.weight"] = sub.effective_weight().detach()
    return out


def load_effective_state_dict(module: nn.Module, state: dict[str, Tensor]) -> None:
    """The inverse of ``effective_state_dict``: load plain LLaMA weights (``state``, full-model names) into
    ``module``, SSN layers as their trainable factors (W′ = Uᵀ W, E_k = (E − F) U, exact for weights of the
    form SSN computes). Keys ``module`` lacks are ignored (another stage's); a missing one raises."""
    mine = dict(state)
    for name, sub in module.named_modules():
        key = f"{name}.weight"
        if isinstance(sub, SubspaceLinear):
            mine[key] = sub.U.t() @ state[key]  # (k, in)
        elif isinstance(sub, SubspaceEmbedding):
            mine[key] = (state[key] - sub.F) @ sub.U  # (V, k)
    module.load_state_dict({k: mine[k] for k in module.state_dict()}, strict=True)


def residual_in_subspace(h: Tensor, ids: Tensor, U: Tensor, table: Tensor) -> float:
    """max |(I − UUᵀ)(h − F[t])|: how far a residual stream is from SSN's subspace (0 up to rounding)."""
    x = h.detach() - table[ids]
    return float((x - (x @ U) @ U.t()).abs().max())


def ssn_std(model: nn.Module) -> float:
    return float(getattr(getattr(model, "cfg", None), "init_std", 0.02))

