"""Residual vector quantization (RVQ) of the r-dim boundary codes, with versioned EMA codebooks.

Algorithm (docs/methods.md, 'Residual vector quantization'). Q levels, each a codebook
of K vectors in R^dim. Encoding x (N, dim): r_0 = x; at level q the index i_q = argmin_k ‖r_q − C_q[k]‖² and
r_{q+1} = r_q − C_q[i_q]. The reconstruction is x̂ = Σ_q C_q[i_q], summed in level order by ``decode_indices``
on both the sender and the receiver, so they agree bit for bit. The forward returns x̂ with a straight-through
gradient (identity to x) and the commitment loss β · mean_tokens ‖x − sg(x̂)‖², which the sender adds to its
loss.

Codebook learning, on the sender only, in training mode:
- k-means initialisation (Lloyd, ``kmeans_iters`` iterations) of level 0 on the first training batch,
  then of level q on the residuals left by levels < q; starting centroids are drawn by
  :func:`seeded_rows`, a pure function of (seed, step, level), so a fixed seed gives a fixed codebook.
- EMA (VQ-VAE style, without Laplace smoothing): with n_k the batch count and s_k the batch sum of the
  residuals assigned to code k, N_k ← γ N_k + (1−γ) n_k, S_k ← γ S_k + (1−γ) s_k, and C_k ← S_k / N_k
  *for codes used in the batch only*. An unused code keeps its vector (S_k / N_k is unchanged by the
  common decay), so a batch changes only the rows it touched and deltas stay sparse.
- Dead codes: an unused code whose EMA count falls below ``dead_threshold`` × (mean EMA count) is
  replaced by a random residual of the batch (:func:`seeded_rows` picks them) and given the mean count.
  The default 1.0 re-seeds every unused code below the mean at once. Boundary codes drift far from
  their step-0 k-means start while the model learns; with 0.01 a stranded code waited ~460 steps
  (decay 0.99, 512 tokens a step), and the last boundary of a 4-stage pipeline collapsed to 1-2 codes
  per batch: the model stalled at unigram loss (issue 10's long-regime benchmark).

Update timing. Training forwards add their statistics to a pending window; once ``update_every``
forwards are pending, the next training forward first applies them as one EMA step (or
``apply_pending_update()`` does). With n forwards in the window the step is N_k ← γⁿ N_k +
(1−γⁿ)/n · Σ n_k (S_k alike): the EMA keeps its time constant in forwards, and the counts stay on the
scale of one forward's, so ``dead_threshold`` means the same for every n; n = 1 is the plain EMA above.
So after a forward the codebook is exactly the one that produced its indices, ``version`` names it,
and a sync message built after the forward (codebook_sync.py) lets the receiver decode that batch.
Between updates the codebook does not change and its sync messages are header-only: updating once
per n forwards divides the codebook rows on the wire by about n (issue 20: with one update per
microbatch the codebook rows were 3/4 of a 16x + RVQ boundary's forward bytes). ``version``
increases by one whenever the codebook changes (init, EMA update, replacement); ``changed_mask`` /
``changed_rows`` give the rows of the latest change. Do not wrap this module in activation
checkpointing: a recomputed forward would count its batch twice.

Why not vector-quantize-pytorch: its codebook synchronisation (EMA statistics, k-means init, dead-code
sampling) all-reduces / broadcasts on the WORLD group by default, while a pipeline boundary needs
sender-side-only EMA plus an explicit, versioned, byte-counted stream to a single receiver. This module
contains no torch.distributed; keep its buffers in float32.

Device and compiler friendliness: the forward never reads a tensor value on the host and creates no
``torch.Generator`` (either would stop a compiled forward and, on a GPU, wait for the device): random rows
come from an integer hash computed on the tensors' device, and EMA / dead-code updates select with
``torch.where`` instead of boolean indexing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from slimpar.codecs.commitment import commitment_loss
from slimpar.codecs.quant import straight_through

_POOL_PURPOSE = 1000  # stream offset of dead-code candidate sampling
_MASK32 = 0xFFFFFFFF
# odd multipliers below 2**31 (lowbias32-style rounds): with x < 2**32 every product stays under 2**63 in int64
_HASH_MULTIPLIERS = (0x7FEB352D, 0x2C1B3C6D)


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of int64 values in [0, 2**32), in int64 arithmetic that cannot overflow."""
    for c in _HASH_MULTIPLIERS:
        x = x ^ (x >> 16)
        x = (x * c) & _MASK32
    return x ^ (x >> 16)


def hashed_positions(size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """_hash32(0, 1, ..., size − 1) (size,) int64: the key-free half of :func:`seeded_rows`, the same for every
    draw of that many rows, so a caller drawing every step keeps it."""
    return _hash32(torch.arange(size, device=device, dtype=torch.int64))


def seeded_rows(n: int, k: int, key: int, device: torch.device | str | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
    """k indices into range(n), a pure function of (n, k, key), computed on ``device``: for n >= k the first
    k of the permutation that sorts hashed positions (distinct rows), else k hashed draws with repetition.
    The same on every device (integer arithmetic), with no ``torch.Generator``. ``positions``: a kept
    :func:`hashed_positions` of exactly max(n, k, 1) rows on ``device`` (else they are computed here)."""
    positions = _kept_positions(n, k, device, positions)
    return _draw(_hash32((positions + (key & _MASK32)) & _MASK32), n, k)


def seeded_rows_each(n: int, k: int, keys: list[int], device: torch.device | str | None = None,
                     positions: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """:func:`seeded_rows` for each of ``keys``, the same rows bit for bit, from one hash and one sort of a
    (len(keys), size) stack: a draw per RVQ level costs the launches of one (one key: no stack)."""
    if len(keys) == 1:
        return (seeded_rows(n, k, keys[0], device, positions),)
    positions = _kept_positions(n, k, device, positions)
    return _draw(_hash32(torch.stack([positions + (key & _MASK32) for key in keys]) & _MASK32), n, k).unbind(0)


def _kept_positions(n: int, k: int, device: torch.device | str | None, positions: torch.Tensor | None) -> torch.Tensor:
    size = max(n, k, 1)
    return positions if positions is not None and positions.shape == (size,) else hashed_positions(size, device)


def _draw(h: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """k indices into range(n) per row of keyed hashes h (..., max(n, k, 1)): for n >= k the first k of the
    permutation that sorts them (distinct rows), else k hashed draws with repetition."""
    if n >= k:
        return torch.argsort(h if h.shape[-1] == n else h[..., :n], dim=-1, stable=True)[..., :k]
    return torch.remainder(h[..., :k], max(n, 1))


def nearest_code(x: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """Index of the nearest codebook row for every row of x: argmin_k ‖x − C[k]‖². (N, D), (K, D) -> (N,)."""
    # ‖x‖² is constant per row and dropped; the (N, K) matrix is the dominant cost.
    dist = (codebook * codebook).sum(1) - 2.0 * (x @ codebook.t())  # (N, K)
    return dist.argmin(1)


def decode_indices(codebooks: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Σ_q codebooks[q, indices[..., q]] in level order, float32. (Q, K, D), (..., Q) -> (..., D)."""
    levels, _, dim = codebooks.shape
    if indices.shape[-1] != levels:
        raise ValueError(f"indices end in {indices.shape[-1]} levels, codebooks have {levels}")
    flat = indices.reshape(-1, levels)  # (N, Q)
    out = torch.zeros(flat.shape[0], dim, dtype=torch.float32, device=codebooks.device)  # (N, D)
    for book, codes in zip(codebooks.unbind(0), flat.unbind(1), strict=True):  # a level's codebook and codes
        out = out + book.float().index_select(0, codes)
    return out.reshape(*indices.shape[:-1], dim)


def code_counts(assign: torch.Tensor, k: int, into: torch.Tensor | None = None) -> torch.Tensor:
    """How many rows chose each of k codes, float32 (k,): ``bincount`` with a shape known before the data
    (bincount's output length depends on the largest index; counts are exact integers up to 2**24). ``into``:
    float32 counts (k,) to add them to in place (returned), instead of a new zero tensor."""
    ones = torch.ones(assign.shape, dtype=torch.float32, device=assign.device)
    if into is None:
        into = torch.zeros(k, dtype=torch.float32, device=assign.device)
    return into.index_add_(0, assign, ones)


def kmeans(x: torch.Tensor, k: int, iters: int, key: int) -> tuple[torch.Tensor, ...]:
    """Lloyd's k-means on x (N, D); starting centroids are k rows of x drawn by :func:`seeded_rows` (``key``).

    Returns (centroids (k, D), counts (k,), sums (k, D)) where counts/sums describe the last assignment
    and each non-empty centroid is its cluster mean; an empty cluster keeps its previous centroid.
    """
    centroids = x[seeded_rows(x.shape[0], k, key, x.device)].clone()  # (k, D)
    for _ in range(iters):
        assign = nearest_code(x, centroids)  # (N,)
        counts = code_counts(assign, k)  # (k,)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)  # (k, D)
        nonempty = counts > 0
        centroids = torch.where(nonempty[:, None], sums / counts.clamp_min(1.0)[:, None], centroids)
    return centroids, counts, sums


class ResidualVQ(nn.Module):
    """Q-level residual VQ with sender-side EMA codebooks, dead-code replacement and a version counter."""

    def __init__(
        self,
        dim: int,
        levels: int,
        codebook_size: int,
        decay: float = 0.99,
        commitment: float = 0.25,
        dead_threshold: float = 1.0,
        kmeans_iters: int = 10,
        seed: int = 0,
        eps: float = 1e-6,
        update_every: int = 1,
    ):
        super().__init__()
        if dim < 1 or levels < 1 or codebook_size < 2:
            raise ValueError(
                f"need dim >= 1, levels >= 1, codebook_size >= 2; got {dim}, {levels}, {codebook_size}"
            )
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must lie in [0, 1), got {decay}")
        if kmeans_iters < 1 or dead_threshold < 0:
            raise ValueError("kmeans_iters must be >= 1 and dead_threshold >= 0")
        if update_every < 1:
            raise ValueError(f"update_every must be >= 1 training forwards, got {update_every}")
        self.dim, self.levels, self.codebook_size = dim, levels, codebook_size
        self.decay, self.commitment, self.dead_threshold = decay, commitment, dead_threshold
        self.kmeans_iters, self.seed, self.eps = kmeans_iters, seed, eps
        self.update_every = update_every
        shape = (levels, codebook_size)
        self.register_buffer("codebooks", torch.zeros(*shape, dim))  # (Q, K, D)
        self.register_buffer("cluster_size", torch.zeros(*shape))  # (Q, K) EMA counts N_k
        self.register_buffer("embed_sum", torch.zeros(*shape, dim))  # (Q, K, D) EMA sums S_k
        # Statistics of the pending window's training forwards, applied as one EMA step.
        self.register_buffer("pending_counts", torch.zeros(*shape))  # (Q, K)
        self.register_buffer("pending_sums", torch.zeros(*shape, dim))  # (Q, K, D)
        self.register_buffer("pending_pool", torch.zeros(*shape, dim))  # (Q, K, D) dead-code candidates
        self.register_buffer("changed", torch.zeros(*shape, dtype=torch.bool), persistent=False)
        self.version = 0  # bumped on every codebook change
        self.steps = 0  # training forwards seen; seeds the generators
        self.initialized = False
        self.pending_forwards = 0  # training forwards whose statistics wait in the pending buffers
        self._hashed: torch.Tensor | None = None  # hashed_positions of the last candidate draw (_positions)

    # -- public API -------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, windows: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (..., dim) -> (quantized (..., dim) in x.dtype, indices (..., Q) int64, commit_loss scalar).

        ``windows`` n > 1: x is n training forwards' inputs joined along dim 0 (equal parts, in order), and this
        call does what those n forwards would: k-means starts on the first part, the statistics of all n join
        the pending window, dead-code candidates come from the last part with its key, and ``steps`` advances
        by n. Nothing changes the codebook between the parts (an update starts a forward only), so the indices
        are the n forwards' and the commitment loss is the mean of theirs (equal parts)."""
        if x.shape[-1] != self.dim:
            raise ValueError(f"last dimension {x.shape[-1]} != dim {self.dim}")
        flat = x.detach().reshape(-1, self.dim).float()  # (N, D)
        if flat.shape[0] % windows:
            raise ValueError(f"{flat.shape[0]} vectors do not split into {windows} equal forwards")
        if self.training:
            with torch.no_grad():
                if not self.initialized:
                    self.init_codebooks(flat[:flat.shape[0] // windows])
                elif self.pending_forwards >= self.update_every:
                    self.apply_pending_update()
        elif not self.initialized:
            raise RuntimeError("ResidualVQ is not initialised: run a training forward or init_codebooks()")
        with torch.no_grad():
            idx = self._assign(flat, collect=self.training, windows=windows)  # (N, Q)
            q = decode_indices(self.codebooks, idx)  # (N, D) float32
        commit = commitment_loss(x, q, self.commitment)  # one autograd node (codecs/commitment.py)
        if self.training:
            self.steps += windows
        quantized = straight_through(x, q.reshape(x.shape))
        return quantized, idx.reshape(*x.shape[:-1], self.levels), commit

    def decode(self, indices: torch.Tensor) -> torch.Tensor:
        """Reconstruction (..., dim) float32 from indices (..., Q); equals forward's quantized value."""
        return decode_indices(self.codebooks, indices)

    @torch.no_grad()
    def init_codebooks(self, x: torch.Tensor) -> None:
        """k-means every level in turn on the residuals of x (..., dim); sets version += 1."""
        residual = x.detach().reshape(-1, self.dim).float().clone()  # (N, D)
        for q in range(self.levels):
            centroids, counts, sums = kmeans(
                residual, self.codebook_size, self.kmeans_iters, self._key(q)
            )
            self.codebooks[q].copy_(centroids)
            self.cluster_size[q].copy_(counts)
            self.embed_sum[q].copy_(sums)
            residual -= centroids[nearest_code(residual, centroids)]
        self.initialized, self.pending_forwards = True, 0
        self._mark_changed(torch.ones_like(self.changed))

    @torch.no_grad()
    def set_codebooks(self, codebooks: torch.Tensor, cluster_size: torch.Tensor | None = None) -> None:
        """Install codebooks (Q, K, dim) with EMA counts (Q, K) (default 1); S_k = N_k C_k; version += 1."""
        self.codebooks.copy_(codebooks)
        self.cluster_size.copy_(torch.ones_like(self.cluster_size) if cluster_size is None else cluster_size)
        self.embed_sum.copy_(self.codebooks * self.cluster_size[..., None])
        self.initialized, self.pending_forwards = True, 0
        self._mark_changed(torch.ones_like(self.changed))

    @torch.no_grad()
    def apply_pending_update(self) -> bool:
        """Apply the pending window's EMA update and dead-code replacement (every level at once); True (a new
        version) when there was a window. Every window of at least one vector uses a code, so it changes rows: the
        version is bumped without reading the changed mask on the host."""
        if not self.pending_forwards:
            return False
        changed = self._ema(self.pending_forwards)
        self.pending_forwards = 0
        self._mark_changed(changed)
        return True

    @property
    def has_pending(self) -> bool:
        """True while training statistics wait to be applied."""
        return self.pending_forwards > 0

    @property
    def changed_mask(self) -> torch.Tensor:
        """(Q, K) bool: rows changed by the latest codebook change (the one that set ``version``)."""
        return self.changed.clone()

    def changed_rows(self, level: int) -> torch.Tensor:
        """Row ids (int64) of level ``level`` changed by the latest codebook change."""
        return self.changed[level].nonzero().squeeze(1)

    def get_extra_state(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "steps": self.steps,
            "initialized": self.initialized,
            "pending_forwards": self.pending_forwards,
        }

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.version, self.steps = int(state["version"]), int(state["steps"])
        self.initialized = bool(state["initialized"])
        # checkpoints written before update_every held one pending batch at most: "has_pending"
        self.pending_forwards = int(state.get("pending_forwards", bool(state.get("has_pending", False))))

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, levels={self.levels}, codebook_size={self.codebook_size}, decay={self.decay}, "
            f"commitment={self.commitment}, dead_threshold={self.dead_threshold}, seed={self.seed}, "
            f"update_every={self.update_every}"
        )

    # -- internals --------------------------------------------------------------------------------
    def _assign(self, flat: torch.Tensor, collect: bool, windows: int = 1) -> torch.Tensor:
        """Greedy residual assignment (N, D) -> (N, Q); with ``collect`` record the EMA statistics of ``windows``
        forwards (equal parts of the rows)."""
        residual, codes = flat, []  # (N, D); each level's (N,) codes
        # each level's codebook and window, as views taken once per forward (an index per use is a call each)
        books = self.codebooks.unbind(0)
        window = zip(*(t.unbind(0) for t in (self.pending_counts, self.pending_sums, self.pending_pool)),
                     strict=True) if collect else None
        draws = self._draws(flat.shape[0] // windows, windows, flat.device) if collect else None
        if collect and not self.pending_forwards:  # the first forward of a window: every level's window anew
            self.pending_counts.zero_()
            self.pending_sums.zero_()
        for q, book in enumerate(books):
            codes.append(nearest_code(residual, book))  # (N,)
            if collect:
                self._collect(residual, codes[q], windows, next(window), draws[q])
            if q + 1 < self.levels:  # the last level's residual is not used
                residual = residual - book.index_select(0, codes[q])
        self.pending_forwards += windows if collect else 0
        return torch.stack(codes, dim=1)  # (N, Q)

    def _draws(self, n: int, windows: int, device: torch.device) -> list[torch.Tensor | None]:
        """Each level's dead-code candidates: K rows of the last of ``windows`` forwards (n rows), drawn with that
        forward's key for the level (one draw for every level, :func:`seeded_rows_each`)."""
        if n == 0:
            return [None] * self.levels
        k, keys = self.codebook_size, [self._key(_POOL_PURPOSE + q, ahead=windows - 1) for q in range(self.levels)]
        return list(seeded_rows_each(n, k, keys, device, self._positions(max(n, k, 1), device)))

    def _collect(self, residual: torch.Tensor, assign: torch.Tensor, windows: int,
                 window: tuple[torch.Tensor, torch.Tensor, torch.Tensor], rows: torch.Tensor | None) -> None:
        """Add a level's batch counts n_k and sums s_k to its window (``window``: the level's pending counts, sums
        and candidate pool); keep its K candidate residuals ``rows`` of the last of ``windows`` forwards."""
        k = self.codebook_size
        counts, sums, pool = window  # zeroed for every level at a window's first forward (_assign)
        code_counts(assign, k, into=counts)  # exact integers: the same sum as adding a count
        sums.index_add_(0, assign, residual)
        if rows is None:  # no rows in a forward
            return
        n = residual.shape[0] // windows
        last = residual[residual.shape[0] - n:] if windows > 1 else residual  # (n, D): the last forward's rows
        pool.copy_(last[rows])

    def _positions(self, size: int, device: torch.device) -> torch.Tensor:
        """:func:`hashed_positions` of ``size`` rows, kept between forwards (a forward's row count rarely changes):
        eleven launches a level and a forward fewer. Plain state, not a buffer: derived, never saved."""
        kept = self._hashed
        if kept is None or kept.shape != (size,) or kept.device != device:
            kept = self._hashed = hashed_positions(size, device)
        return kept

    def _ema(self, n: int) -> torch.Tensor:
        """EMA step of every level over a window of n forwards, then dead-code replacement; (Q, K) changed.

        The levels' rows are independent, so the Q levels go as one (Q, K[, D]) batch: each op does per level
        what it would on the level alone (a level's mean count sums its own row of K), in Q times fewer calls."""
        counts = self.pending_counts  # (Q, K) summed over the window
        decay = self.decay**n
        weight = (1.0 - decay) / n
        size = self.cluster_size.mul_(decay).add_(counts, alpha=weight)  # (Q, K)
        sums = self.embed_sum.mul_(decay).add_(self.pending_sums, alpha=weight)  # (Q, K, D)
        used = counts > 0  # (Q, K)
        book = torch.where(used[..., None], sums / size.clamp_min(self.eps)[..., None], self.codebooks)
        mean_size = size.sum(1, keepdim=True) / self.codebook_size  # (Q, 1)
        dead = ~used & (size < self.dead_threshold * mean_size)  # (Q, K)
        # the j-th dead row of a level (in row order) takes its pool's j-th candidate: the pool is in random order
        pick = (torch.cumsum(dead, 1) - 1).clamp_min(0)  # (Q, K)
        fresh = self.pending_pool.gather(1, pick[..., None].expand_as(self.pending_pool))  # (Q, K, D)
        dead_rows = dead[..., None]  # (Q, K, 1)
        self.codebooks.copy_(torch.where(dead_rows, fresh, book))
        self.embed_sum.copy_(torch.where(dead_rows, fresh * mean_size[..., None], sums))
        self.cluster_size.copy_(torch.where(dead, mean_size, size))
        return used | dead

    def _mark_changed(self, mask: torch.Tensor) -> None:
        self.changed.copy_(mask)
        self.version += 1

    def _key(self, purpose: int, ahead: int = 0) -> int:
        """The sampling key of (seed, steps, purpose): randomness is a pure function of them (``ahead``: of the
        training forward that many after the current one)."""
        return ((self.seed * 1_000_003 + self.steps + ahead) * 65_537 + purpose) % (1 << 32)
