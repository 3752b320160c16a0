"""CIFAR-style ResNet-18 and WideResNet-18 (He et al. 2016; Zagoruyko & Komodakis 2016).

Single-device code. The stem is a 3x3 stride-1 convolution without max-pooling (small images), then
eight BasicBlocks in one flat ``nn.ModuleDict`` named ``blocks`` keyed "0".."7", then global average
pooling and a linear head ``fc``. The forward runs whichever blocks are present, in key order, so a
block subnetwork is a plain deletion (``del model.blocks["3"]``) that keeps every other parameter
name stable. Only blocks with an identity shortcut (``maskable``) can be removed without breaking
shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ResNetConfig:
    """The shape of a CIFAR-stem ResNet: channels and BasicBlocks per stage, classes, input channels."""

    widths: tuple[int, ...] = (64, 128, 256, 512)  # output channels of each stage
    blocks: tuple[int, ...] = (2, 2, 2, 2)  # BasicBlocks per stage
    num_classes: int = 10  # classifier outputs
    in_channels: int = 3  # 1 for Fashion-MNIST / digits, 3 for CIFAR

    def __post_init__(self) -> None:
        if len(self.widths) != len(self.blocks):
            raise ValueError(f"widths {self.widths} and blocks {self.blocks} need one entry per stage")
        if self.in_channels not in (1, 3):
            raise ValueError(f"in_channels must be 1 or 3, got {self.in_channels}")

    def block_specs(self) -> list[tuple[int, int, int]]:
        """(in_planes, planes, stride) of every block in global order; stage s > 0 starts with stride 2."""
        specs, in_planes = [], self.widths[0]
        for stage, (planes, n) in enumerate(zip(self.widths, self.blocks, strict=True)):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                specs.append((in_planes, planes, stride))
                in_planes = planes
        return specs


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BN: ``relu(residual_scale * bn2(conv2(relu(bn1(conv1 x)))) + shortcut(x))``.

    The "inner channels" (conv1's outputs, bn1, conv2's inputs) never leave the block, so a
    channel subnetwork may slice them freely; the shortcut is the identity when shapes agree and
    a 1x1 convolution + BN projection otherwise.
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Sequential | None = None
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )
        # A block whose output shape equals its input shape can be skipped by the model's forward.
        self.maskable: bool = self.shortcut is None
        # Multiplies the residual branch; 1.0 in training. Evaluating the full model after block
        # subnetwork training may set it to the block's keep probability (stochastic-depth rescaling).
        self.residual_scale: float = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, Cin, H, W) -> (B, C, H/s, W/s)
        branch = F.relu(self.bn1(self.conv1(x)))
        branch = self.bn2(self.conv2(branch))
        skip = x if self.shortcut is None else self.shortcut(x)
        return F.relu(self.residual_scale * branch + skip)


class ResNet(nn.Module):
    """ResNet for small images: CIFAR stem, flat ``blocks`` ModuleDict, average pool, ``fc`` head."""

    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        self.cfg = cfg
        width0 = cfg.widths[0]
        self.conv1 = nn.Conv2d(cfg.in_channels, width0, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width0)
        self.blocks = nn.ModuleDict({str(i): BasicBlock(cin, c, s) for i, (cin, c, s) in enumerate(cfg.block_specs())})
        self.fc = nn.Linear(cfg.widths[-1], cfg.num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """He-normal (fan-out) convolutions, unit BN scales, PyTorch's default for the head."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        self.fc.reset_parameters()

    def block_keys(self) -> list[str]:
        """Keys of the blocks still present, in numeric order (deleted blocks are absent)."""
        return sorted(self.blocks.keys(), key=int)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, Cin, H, W) -> (B, num_classes)
        h = F.relu(self.bn1(self.conv1(x)))  # (B, C0, H, W)
        for key in self.block_keys():
            h = self.blocks[key](h)
        h = h.mean(dim=(2, 3))  # (B, C_last)
        return self.fc(h)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def resnet18(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    """CIFAR ResNet-18: widths 64-128-256-512, two BasicBlocks per stage (11,173,962 params at 10 classes)."""
    return ResNet(ResNetConfig(num_classes=num_classes, in_channels=in_channels))


def wrn18(num_classes: int = 10, in_channels: int = 3, width: int = 2) -> ResNet:
    """WideResNet-18: ResNet-18's topology with every stage (and the stem) ``width`` times wider."""
    widths = tuple(width * c for c in ResNetConfig.widths)
    return ResNet(ResNetConfig(widths=widths, num_classes=num_classes, in_channels=in_channels))
