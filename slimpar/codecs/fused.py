"""MAPL's boundary maps as one autograd node each: the sender's c = Aᵀx and the receiver's ĥ = Ac + E[t]P.

Why by hand: autograd records ``x @ A`` on a (mb, T, d) tensor as a reshape, a matmul and a view, and
``E[t] @ P`` as a gather, a reshape, a matmul and a view, then the sum; its backward adds a transpose, a view
and a saved-tensor unpack around every product. In an eager step those dispatcher calls, not the arithmetic,
are what a boundary costs (docs/pipeline.md, 'One process: the virtual pipeline'). The functions here compute
the same products on 2-D matrices and return every gradient from one backward (``StiefelProjector`` uses them):

    down:  c = X A                          ∂X = G Aᵀ          ∂A = Xᵀ G
    lift:  ĥ = C Aᵀ + E[t] P                ∂C = G A           ∂A = Gᵀ C      ∂E[v] = Σ_{t_i = v} (G Pᵀ)_i

with X (n, d), C and G rows of tokens and P (m, d) frozen. Under autocast the products run in the autocast
dtype, as autocast would run the matmuls, and each gradient returns in its input's dtype. No communication.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor


def _autocast_plan(x: Tensor, w: Tensor) -> tuple[torch.dtype, contextlib.AbstractContextManager]:
    """The matmul dtype autocast would pick for (x, w) (its own where enabled, else their promotion) and a context
    that turns autocast off for a forward that has chosen it (a null context on devices without autocast)."""
    dev = x.device.type
    if not torch.amp.is_autocast_available(dev):
        return (x.dtype if x.dtype == w.dtype else torch.promote_types(x.dtype, w.dtype)), contextlib.nullcontext()
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else (
        x.dtype if x.dtype == w.dtype else torch.promote_types(x.dtype, w.dtype))  # promote_types is an aten op
    return dt, torch.autocast(dev, enabled=False)


class _Down(torch.autograd.Function):
    """c = x A per token, x (..., d), A (d, r)."""

    @staticmethod
    def forward(ctx, x: Tensor, A: Tensor) -> Tensor:
        dt, no_autocast = _autocast_plan(x, A)
        with no_autocast:
            X, W = x.reshape(-1, x.shape[-1]).to(dt), A.to(dt)  # (n, d), (d, r)
            ctx.save_for_backward(X, W)
            ctx.dtypes = (x.dtype, A.dtype)
            return torch.mm(X, W).view(*x.shape[:-1], A.shape[1])

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None]:
        X, W = ctx.saved_tensors
        G = g.reshape(-1, g.shape[-1]).to(X.dtype)  # (n, r)
        gx = torch.mm(G, W.t()).view(*g.shape[:-1], X.shape[1]).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
        gA = torch.mm(X.t(), G).to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None
        return gx, gA


class _Lift(torch.autograd.Function):
    """ĥ = c Aᵀ (+ E[ids] P) per token, c (..., r), A (d, r), E (V, m), P (m, d) frozen, ids (...)."""

    @staticmethod
    def forward(ctx, c: Tensor, A: Tensor, E: Tensor | None, P: Tensor | None, ids: Tensor | None) -> Tensor:
        dt, no_autocast = _autocast_plan(c, A)
        with no_autocast:
            C, W = c.reshape(-1, c.shape[-1]).to(dt), A.to(dt)  # (n, r), (d, r)
            ctx.dtypes = (c.dtype, A.dtype, None if E is None else E.dtype)
            if E is None:
                ctx.save_for_backward(C, W)
                return torch.mm(C, W.t()).view(*c.shape[:-1], A.shape[0])
            flat = ids.reshape(-1)  # (n,)
            Pd = P.to(dt)
            ctx.save_for_backward(C, W)
            ctx.anchor = (Pd, flat, E.shape)  # a frozen buffer and the ids: no gradient, never changed in place
            out = torch.addmm(torch.mm(E[flat].to(dt), Pd), C, W.t())  # E[t] P + C Aᵀ, (n, d)
            return out.view(*c.shape[:-1], A.shape[0])

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:
        C, W = ctx.saved_tensors
        G = g.reshape(-1, g.shape[-1]).to(C.dtype)  # (n, d)
        gc = torch.mm(G, W).view(*g.shape[:-1], C.shape[1]).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
        gA = torch.mm(G.t(), C).to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None
        gE = None
        if ctx.dtypes[2] is not None and ctx.needs_input_grad[2]:
            P, flat, table = ctx.anchor
            rows = torch.mm(G, P.t()).to(ctx.dtypes[2])  # (n, m)
            # the rows summed per id as an embedding's backward sums them: sorted, so the same bits every run
            # (index_put_ with accumulate adds with atomics across threads, in an order that varies run to run)
            gE = torch.ops.aten.embedding_dense_backward(rows, flat, table[0], -1, False)
        return gc, gA, gE, None, None


def stiefel_down(x: Tensor, A: Tensor) -> Tensor:
    """c = Aᵀx per token: x (..., d), A (d, r) -> (..., r); equal to ``x @ A`` to rounding."""
    return _Down.apply(x, A)


def stiefel_lift(c: Tensor, A: Tensor, E: Tensor | None = None, P: Tensor | None = None,
                 ids: Tensor | None = None) -> Tensor:
    """ĥ = Ac + E[t]P per token: c (..., r), A (d, r), optional anchor table E (V, m), basis P (m, d), ids (...)
    -> (..., d); equal to ``c @ A.t() + E[ids] @ P`` to rounding. P gets no gradient."""
    if (E is None) != (P is None) or (E is not None and ids is None):
        raise ValueError("stiefel_lift needs E, P and ids together, or none of them")
    return _Lift.apply(c, A, E, P, ids)
