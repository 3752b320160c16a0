"""Small Swin-Transformer (Liu et al. 2021) for 28-32 px images.

Single-device code. Patch embedding (a strided convolution) turns the image into a token grid kept as
(B, H, W, C); each stage is a run of Swin blocks (pre-LayerNorm windowed multi-head self-attention
with a learned relative position bias, then an MLP), every second block shifting its windows by half
a window with the matching attention mask; patch merging halves the grid and doubles the width
between stages. All blocks live in one flat ``nn.ModuleDict`` named ``blocks`` keyed "0".."N-1"
(numbered across stages) and the merges in ``merges`` keyed by the stage they close. A block never
changes its input's shape and the model knows from its config which stage each block key belongs
to, so deleting any blocks (block subnetworks) keeps shapes and every other parameter name intact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

MASK_VALUE = -100.0  # additive logit for cross-region pairs of a shifted window; exp() underflows to 0


@dataclass
class SwinConfig:
    """The shape of a Swin-Tiny-style classifier: image and patch size, widths, depths, heads, window."""

    img_size: int = 32  # input height = width; padded inside the model when the grid would not divide
    in_channels: int = 3  # 1 for Fashion-MNIST, 3 for CIFAR
    num_classes: int = 10  # classifier outputs
    patch_size: int = 2  # side of the square patch that becomes one token
    embed_dim: int = 48  # token width of stage 0; doubles at every patch merging
    depths: tuple[int, ...] = (2, 2, 4, 2)  # Swin blocks per stage
    heads: tuple[int, ...] = (3, 6, 12, 24)  # attention heads per stage (head width 16)
    window_size: int = 4  # attention window side in tokens (clipped to the grid at late stages)
    mlp_ratio: float = 4.0  # MLP hidden width / token width

    def __post_init__(self) -> None:
        if len(self.depths) != len(self.heads):
            raise ValueError(f"depths {self.depths} and heads {self.heads} need one entry per stage")
        for dim, h in zip(self.stage_dims, self.heads, strict=True):
            if dim % h:
                raise ValueError(f"{h} heads do not divide the stage width {dim}")

    @classmethod
    def tiny(cls, img_size: int = 32, in_channels: int = 3, num_classes: int = 10, **overrides) -> SwinConfig:
        """Swin-Tiny's shape scaled to small images: width 48, depths (2, 2, 4, 2), windows of 4x4 tokens."""
        return cls(img_size=img_size, in_channels=in_channels, num_classes=num_classes, **overrides)

    @property
    def stage_dims(self) -> tuple[int, ...]:
        """Token width of every stage: embed_dim, doubled by each patch merging."""
        return tuple(self.embed_dim * 2**s for s in range(len(self.depths)))

    @property
    def padded_size(self) -> int:
        """Smallest image side >= img_size whose token grid divides into windows and merges at every stage."""
        size = self.img_size
        while not self._grid_fits(size):
            size += 1
        return size

    def _grid_fits(self, size: int) -> bool:
        if size % self.patch_size:
            return False
        res = size // self.patch_size
        for s in range(len(self.depths)):
            if res % min(self.window_size, res):
                return False
            if s < len(self.depths) - 1:
                if res % 2:
                    return False
                res //= 2
        return True

    def stage_resolutions(self) -> list[int]:
        """Token-grid side of every stage (after padding)."""
        res = self.padded_size // self.patch_size
        return [res // 2**s for s in range(len(self.depths))]


def window_partition(x: torch.Tensor, w: int) -> torch.Tensor:
    """(B, H, W, C) -> (B, nW, w*w, C): non-overlapping w x w windows in row-major order."""
    B, H, W, C = x.shape
    x = x.view(B, H // w, w, W // w, w, C).permute(0, 1, 3, 2, 4, 5)  # (B, H/w, W/w, w, w, C)
    return x.reshape(B, (H // w) * (W // w), w * w, C)


def window_reverse(windows: torch.Tensor, w: int, H: int, W: int) -> torch.Tensor:
    """Inverse of :func:`window_partition`: (B, nW, w*w, C) -> (B, H, W, C)."""
    B, C = windows.shape[0], windows.shape[-1]
    x = windows.view(B, H // w, W // w, w, w, C).permute(0, 1, 3, 2, 4, 5)  # (B, H/w, w, W/w, w, C)
    return x.reshape(B, H, W, C)


def relative_position_index(w: int) -> torch.Tensor:
    """(w*w, w*w) index into the (2w-1)^2 bias table for every (query, key) pair of a window."""
    coords = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")).flatten(1)  # (2, N)
    rel = coords[:, :, None] - coords[:, None, :] + (w - 1)  # (2, N, N), each in [0, 2w-2]
    return rel[0] * (2 * w - 1) + rel[1]


def shifted_window_mask(res: int, w: int, shift: int) -> torch.Tensor:
    """(nW, N, N) additive mask: after a cyclic shift, tokens from different image regions share a
    window; they must not attend to each other, so those pairs get :data:`MASK_VALUE`."""
    regions = torch.zeros(1, res, res, 1)
    bands = (slice(0, -w), slice(-w, -shift), slice(-shift, None))
    label = 0
    for hs in bands:
        for ws in bands:
            regions[:, hs, ws, :] = label
            label += 1
    labels = window_partition(regions, w)[0, :, :, 0]  # (nW, N)
    diff = labels[:, None, :] != labels[:, :, None]  # (nW, N, N)
    return torch.zeros(diff.shape).masked_fill(diff, MASK_VALUE)


class WindowAttention(nn.Module):
    """Multi-head self-attention inside each window with a learned relative position bias per head."""

    def __init__(self, dim: int, heads: int, w: int):
        super().__init__()
        self.heads, self.w = heads, w
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * w - 1) ** 2, heads))
        self.register_buffer("rel_index", relative_position_index(w), persistent=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, nW, N, C = x.shape  # windows of N tokens
        qkv = self.qkv(x).view(B, nW, N, 3, self.heads, C // self.heads)
        q, k, v = qkv.permute(3, 0, 1, 4, 2, 5).unbind(0)  # each (B, nW, heads, N, hd)
        bias = self.relative_position_bias_table[self.rel_index]  # (N, N, heads)
        bias = bias.permute(2, 0, 1)  # (heads, N, N)
        if mask is not None:
            bias = bias + mask[:, None]  # (nW, heads, N, N)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))  # (B, nW, heads, N, hd)
        return self.proj(y.transpose(2, 3).reshape(B, nW, N, C))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SwinBlock(nn.Module):
    """x + s * attn(norm1(x)) with (shifted) windows, then x + s * mlp(norm2(x)); s = ``residual_scale``.

    The block stores its own stage, grid resolution, window and shift, so it runs correctly wherever
    its neighbours have been deleted.
    """

    def __init__(self, stage: int, dim: int, heads: int, res: int, window: int, shift: int, mlp_ratio: float):
        super().__init__()
        self.stage, self.res, self.window, self.shift = stage, res, window, shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, heads, window)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        mask = shifted_window_mask(res, window, shift) if shift else None
        self.register_buffer("attn_mask", mask, persistent=False)
        # Every Swin block keeps the shape of its input, so any of them can be skipped.
        self.maskable: bool = True
        # Scales both residual branches; 1.0 in training (see BasicBlock.residual_scale).
        self.residual_scale: float = 1.0

    def _attend(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, W, C) -> (B, H, W, C)
        H, W = x.shape[1:3]
        if self.shift:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        y = self.attn(window_partition(x, self.window), self.attn_mask)  # (B, nW, N, C)
        y = window_reverse(y, self.window, H, W)
        if self.shift:
            y = torch.roll(y, shifts=(self.shift, self.shift), dims=(1, 2))
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, W, C)
        x = x + self.residual_scale * self._attend(self.norm1(x))
        return x + self.residual_scale * self.mlp(self.norm2(x))


class PatchMerging(nn.Module):
    """Concatenate each 2x2 neighbourhood of tokens (4C), normalise, project to 2C: halves the grid."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, W, C) -> (B, H/2, W/2, 2C)
        parts = [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]]
        return self.reduction(self.norm(torch.cat(parts, dim=-1)))


class Swin(nn.Module):
    """Swin classifier: patch embed -> Swin-block stages and patch merging -> LayerNorm -> pool -> head."""

    def __init__(self, cfg: SwinConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Conv2d(cfg.in_channels, cfg.embed_dim, cfg.patch_size, stride=cfg.patch_size)
        self.patch_norm = nn.LayerNorm(cfg.embed_dim)
        self.blocks = nn.ModuleDict()
        self.merges = nn.ModuleDict()
        # Block keys of each stage, fixed by the config so the forward survives deletions.
        self.stage_keys: list[list[str]] = []
        for s, res in enumerate(cfg.stage_resolutions()):
            dim, window = cfg.stage_dims[s], min(cfg.window_size, res)
            keys = []
            for i in range(cfg.depths[s]):
                # A window covering the whole grid has nothing to shift across.
                shift = window // 2 if i % 2 == 1 and res > window else 0
                key = str(len(self.blocks))
                self.blocks[key] = SwinBlock(s, dim, cfg.heads[s], res, window, shift, cfg.mlp_ratio)
                keys.append(key)
            self.stage_keys.append(keys)
            if s < len(cfg.depths) - 1:
                self.merges[str(s)] = PatchMerging(dim)
        self.norm = nn.LayerNorm(cfg.stage_dims[-1])
        self.head = nn.Linear(cfg.stage_dims[-1], cfg.num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Truncated-normal(0.02) linear weights and bias tables, zero biases, unit LayerNorms."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, WindowAttention):
                nn.init.trunc_normal_(m.relative_position_bias_table, std=0.02)

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        # 28-px Fashion-MNIST becomes 32 px (14 tokens would not split into 4x4 windows or halve
        # three times); zero padding, split evenly around the image, equals the mean after normalising.
        extra = self.cfg.padded_size - x.shape[-1]
        if extra == 0:
            return x
        return F.pad(x, (extra // 2, extra - extra // 2, extra // 2, extra - extra // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, Cin, S, S) -> (B, num_classes)
        if x.shape[-1] != self.cfg.img_size or x.shape[-2] != self.cfg.img_size:
            raise ValueError(f"expected {self.cfg.img_size}x{self.cfg.img_size} images, got {tuple(x.shape)}")
        h = self.patch_embed(self._pad(x)).permute(0, 2, 3, 1)  # (B, R, R, C0)
        h = self.patch_norm(h)
        for s, keys in enumerate(self.stage_keys):
            for key in keys:
                if key in self.blocks:
                    h = self.blocks[key](h)
            if str(s) in self.merges:
                h = self.merges[str(s)](h)  # (B, R/2, R/2, 2C)
        h = self.norm(h).mean(dim=(1, 2))  # (B, C_last)
        return self.head(h)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
