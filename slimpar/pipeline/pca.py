"""PCA start of MAPL's projectors: A_p = the top-r right singular vectors of boundary p's activations.

``--pipeline.projector_init pca`` (docs/methods.md, 'Projector start'; issue 10: a random A barely moves in a short
run, so MAPL behaves like a fixed random projection). Before the first optimizer step the pipeline runs a
forward-only calibration pass over the first ``pca_batches`` training batches, stage by stage:

  stage s   (s > 0) receive A_{s−1} and the calibration codes from stage s − 1, decode them
            (ĥ = A_{s−1}c + o(t)), run the stage's blocks → h (tokens × d, the residual stream that
            crosses boundary s); X = h − o_s(t) when anchors are on, else h
            G = Σ XᵀX over the batches (float64; summed over the stage's data-parallel replicas)
            A_s = the r eigenvectors of G with the largest eigenvalues = the top-r right singular
            vectors of X (signs fixed: the largest-magnitude entry of each column is positive)
            send A_s (``sync``, d·r fp32) and the codes c = X A_s (``payload``, r fp32 per token)

Who computes A (**Decision**): the sending stage, which then sends it. Only the sender sees h; the
receiver holds the compressed c, so computing A "deterministically on both ends" would mean running
stages 0..s on the receiver too. Sending A costs d·r·4 bytes once per boundary (counted as sync
bytes in step 0), and the receiver copies the sender's fp32 bits, so both ends hold bitwise the same
A with no reliance on identical eigensolvers. Stages go in order, so boundary s is calibrated on the
activations the trained pipeline will really see: those decoded through the PCA-started A_{s−1}.

Calibration codes are sent unquantized (no RVQ, no codebook update) and the token ids are read
locally (every stage reads its batch); all of it is counted at the send, in step 0. Nothing is
trained: no autograd, no optimizer step, and the later training step 0 runs on the new A.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from slimpar.codecs.projector import StiefelProjector
from slimpar.pipeline.split import StageModule
from slimpar.pipeline.wire import Link, Packet, WireSpec, wait_all

TAG_PCA = 105  # calibration messages (A, then the codes of every batch), next to the schedule's tag 0


def top_subspace(gram: Tensor, r: int) -> Tensor:
    """The (d, r) fp32 eigenvectors of a symmetric d×d ``gram`` = XᵀX for its r largest eigenvalues.

    These are the top-r right singular vectors of X. eigh runs in float64; each column's sign makes
    its largest-magnitude entry positive, so the result is a deterministic function of ``gram``.
    """
    _, vecs = torch.linalg.eigh(gram.double())  # ascending eigenvalues
    A = vecs[:, -r:].flip(1)  # (d, r), largest first
    pivot = A.abs().argmax(dim=0)  # (r,)
    signs = torch.sign(A[pivot, torch.arange(r, device=A.device)])
    signs[signs == 0] = 1
    return (A * signs).to(torch.float32).contiguous()


def _projector(half) -> StiefelProjector | None:
    proj = getattr(half, "projector", None) if half is not None else None
    return proj if isinstance(proj, StiefelProjector) else None


def _set_ids(stage: StageModule, x: Tensor) -> None:
    stage.context.set_batch(x, 1)
    stage.context.microbatch = 0


@torch.no_grad()
def calibrate_stage(stage: StageModule, batches: list[Tensor], link_in: Link | None, link_out: Link | None,
                    reduce: Callable[[Tensor], Tensor] | None = None, keep: frozenset[int] = frozenset()
                    ) -> Tensor | None:
    """Stage ``stage``'s part of the PCA start; returns the boundary Gram matrix it used (or None).

    ``batches`` are the (b, T) token batches of this replica (every stage reads them: token ids on
    stage 0, anchor ids elsewhere); ``link_in`` / ``link_out`` connect to the previous / next stage;
    ``reduce`` sums the d×d Gram over the stage's data-parallel replicas so that they all get one A.
    Call it on every stage in stage order (the virtual pipeline) or concurrently on every rank.
    ``keep``: boundaries whose A stays as it is (a resumed run's kept cuts, while its new cuts get a PCA
    start); the pass still runs through them, their sender sending its current A and the codes.
    """
    dec, enc = stage.decoder, stage.encoder
    codes: list[Tensor] = []
    if dec is not None:
        dec_proj = _projector(dec)
        if dec_proj is None:
            raise ValueError("the PCA start needs MAPL (Stiefel) projectors at every boundary")
        shapes = [WireSpec("sync", tuple(dec_proj.A.shape), torch.float32)]
        shapes += [WireSpec("payload", (*x.shape, dec_proj.r), torch.float32) for x in batches]
        bufs, handles = link_in.irecv(shapes, TAG_PCA)
        wait_all(handles)
        dec_proj.A.copy_(bufs[0])  # the sender's fp32 bits
        codes = bufs[1:]
    if enc is None:
        return None
    enc_proj = _projector(enc)
    if enc_proj is None:
        raise ValueError("the PCA start needs MAPL (Stiefel) projectors at every boundary")
    xs, gram = [], None
    for i, x in enumerate(batches):
        _set_ids(stage, x)
        h = stage.model(dec(codes[i]) if dec is not None else x)  # (b, T, d)
        if enc.anchor is not None:
            h = h - enc.anchor(stage.context.current_ids())
        xs.append(h)
        flat = h.reshape(-1, h.shape[-1]).double()
        gram = flat.t() @ flat if gram is None else gram + flat.t() @ flat
    if stage.stage in keep:
        gram = None
    else:
        gram = reduce(gram) if reduce is not None else gram
        enc_proj.A.copy_(top_subspace(gram, enc_proj.r))
    A = enc_proj.A.detach()
    wait_all(link_out.isend([Packet("sync", A.clone())] + [Packet("payload", h @ A) for h in xs], TAG_PCA))
    return gram


def calibrate_virtual(stages: list[StageModule], links: list, batches: list[Tensor],
                      keep: frozenset[int] = frozenset()) -> None:
    """The PCA start of every boundary of a one-process pipeline (``links[p]`` = (sender end, receiver end))
    but those in ``keep``."""
    for s, stage in enumerate(stages):
        link_in = links[s - 1][1] if s > 0 else None
        link_out = links[s][0] if s < len(stages) - 1 else None
        calibrate_stage(stage, batches, link_in, link_out, keep=keep)
