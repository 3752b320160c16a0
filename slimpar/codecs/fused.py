"""MAPL's boundary maps as one autograd node each: the sender's c = Aᵀx and the receiver's ĥ = Ac + E[t]P.

Why by hand: autograd records ``x @ A`` on a (mb, T, d) tensor as a reshape, a matmul and a view, and
``E[t] @ P`` as a gather, a reshape, a matmul and a view, then the sum; its backward adds a transpose, a view
and a saved-tensor unpack around every product. In an eager step those dispatcher calls, not the arithmetic,
are what a boundary costs (docs/pipeline.md, 'One process: the virtual pipeline'). The functions here compute
the same products on 2-D matrices and return every gradient from one backward (``StiefelProjector`` uses them):

    down:  c = X A                          ∂X = G Aᵀ          ∂A = Xᵀ G
    lift:  ĥ = C Aᵀ + E[t] P                ∂C = G A           ∂A = Gᵀ C      ∂E[v] = Σ_{t_i = v} (G Pᵀ)_i

with X (n, d), C and G rows of tokens and P (m, d) frozen. Under autocast the products run in the autocast
dtype, as autocast would run the matmuls, and each gradient returns in its input's dtype. Outside a compiled
region, an A used without a cast is held on the node itself (not through the saved-tensor hooks; its version is
checked in backward as they would), and the transposes of A and P and the ids' flat view are made once per tensor
and kept: each is a dispatcher call of its own at every use otherwise. No communication.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

_VIEWS = WeakIdKeyDictionary()  # a kept tensor (A, P, the ids) -> ((data_ptr, shape, stride), its views)


def _autocast_plan(x: Tensor, w: Tensor) -> tuple[torch.dtype, contextlib.AbstractContextManager]:
    """The matmul dtype autocast would pick for (x, w) (its own where enabled, else their promotion) and a context
    that turns autocast off for a forward that has chosen it (a null context on devices without autocast)."""
    dev = x.device.type
    if not torch.amp.is_autocast_available(dev):
        return (x.dtype if x.dtype == w.dtype else torch.promote_types(x.dtype, w.dtype)), contextlib.nullcontext()
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else (
        x.dtype if x.dtype == w.dtype else torch.promote_types(x.dtype, w.dtype))  # promote_types is an aten op
    return dt, torch.autocast(dev, enabled=False)


def _t(w: Tensor, kept: bool) -> Tensor:
    """wᵀ; for a ``kept`` tensor (a parameter or buffer used as it is, not a cast copy) a view made once and kept,
    since every transpose is a dispatcher call of its own in an eager step. The view shares w's storage, so the
    optimizer's in-place updates show through it."""
    return _kept_view(w, "t") if kept else w.t()


def _kept_view(w: Tensor, how: str) -> Tensor:
    """w's view ``how`` ("t": wᵀ; "flat": w.reshape(-1) of a contiguous w), made once per tensor and kept while w
    lives, made again once w's storage, shape or strides change (``.data`` replaced, a move to another device).
    A tensor subclass (a fake tensor of a tracer or of the stand-in device, a DTensor) has no storage of its own to
    key on, so its view is made at every use."""
    if type(w) is not Tensor and type(w) is not torch.nn.Parameter:
        return _view(w, how)
    views = _VIEWS.get(w)
    if views is None or views[0] != (w.data_ptr(), w.shape, w.stride()):
        views = _VIEWS[w] = ((w.data_ptr(), w.shape, w.stride()), {})
    if how not in views[1]:
        views[1][how] = _view(w, how)
    return views[1][how]


def _view(w: Tensor, how: str) -> Tensor:
    return w.detach().t() if how == "t" else w.view(-1)  # (ids never require a gradient)


def _flat_ids(ids: Tensor) -> Tensor:
    """The token ids as one row (n,): the batch's ids, shared by every boundary of a one-process pipeline, are
    flattened once (outside a compiled region, where the plain reshape is traced)."""
    if torch.compiler.is_compiling() or not ids.is_contiguous():
        return ids.reshape(-1)
    return _kept_view(ids, "flat")


def _keep(ctx, W: Tensor, A: Tensor, *saved: Tensor) -> None:
    """Save ``saved`` and W for backward. W = A itself (no cast) is held on ``ctx`` with its version, checked in
    backward as ``save_for_backward`` would: a parameter is no activation, and saving it through autograd's hooks
    costs a dispatcher call at unpack."""
    ctx.kept = W is A and not torch.compiler.is_compiling()  # a compiled region traces the plain path
    if ctx.kept:
        ctx.W, ctx.version = A, A._version
        ctx.save_for_backward(*saved)
    else:
        ctx.save_for_backward(*saved, W)


def _unkeep(ctx) -> tuple[Tensor, ...]:
    """What :func:`_keep` saved, W last; RuntimeError where A changed in place between forward and backward."""
    if not ctx.kept:
        return ctx.saved_tensors
    if ctx.W._version != ctx.version:
        raise RuntimeError("a Stiefel projector's A was modified in place between its forward and backward; step "
                           "the optimizer after backward")
    return (*ctx.saved_tensors, ctx.W)


class _Down(torch.autograd.Function):
    """c = x A per token, x (..., d), A (d, r)."""

    @staticmethod
    def forward(ctx, x: Tensor, A: Tensor) -> Tensor:
        dt, no_autocast = _autocast_plan(x, A)
        with no_autocast:
            X, W = x.reshape(-1, x.shape[-1]).to(dt), A.to(dt)  # (n, d), (d, r)
            _keep(ctx, W, A, X)
            ctx.dtypes = (x.dtype, A.dtype)
            return torch.mm(X, W).view(*x.shape[:-1], A.shape[1])

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None]:
        X, W = _unkeep(ctx)
        G = g.reshape(-1, g.shape[-1]).to(X.dtype)  # (n, r)
        gx = (torch.mm(G, _t(W, ctx.kept)).view(*g.shape[:-1], X.shape[1]).to(ctx.dtypes[0])
              if ctx.needs_input_grad[0] else None)
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
            _keep(ctx, W, A, C)
            Wt = _t(W, ctx.kept)  # (r, d)
            if E is None:
                return torch.mm(C, Wt).view(*c.shape[:-1], A.shape[0])
            flat = _flat_ids(ids)  # (n,)
            Pd = P.to(dt)
            # a frozen buffer and the ids: no gradient, never changed in place; Pᵀ kept as Aᵀ is
            ctx.anchor = (_t(Pd, Pd is P and ctx.kept), flat, E.shape)
            out = torch.addmm(torch.mm(E[flat].to(dt), Pd), C, Wt)  # E[t] P + C Aᵀ, (n, d)
            return out.view(*c.shape[:-1], A.shape[0])

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:
        C, W = _unkeep(ctx)
        G = g.reshape(-1, g.shape[-1]).to(C.dtype)  # (n, d)
        gc = torch.mm(G, W).view(*g.shape[:-1], C.shape[1]).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
        gA = torch.mm(G.t(), C).to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None
        gE = None
        if ctx.dtypes[2] is not None and ctx.needs_input_grad[2]:
            Pt, flat, table = ctx.anchor
            rows = torch.mm(G, Pt).to(ctx.dtypes[2])  # (n, m)
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
