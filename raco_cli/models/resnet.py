"""ResNet16 with GroupNorm for private image classification (paper Section 6, App. E.7).

The architecture of the paper's CelebA experiment: a ResNet (He et al., 2016) with a 7x7/2
stem convolution, a 3x3/2 max-pool, BasicBlock stages ``[2, 2, 2, 1]`` at widths
``64/128/256/512`` (strides 1/2/2/2), global average pooling and a linear head: 14 block
convolutions + stem + head = 16 weight layers, about 6.4 M parameters for 2 classes.

Every BatchNorm of the standard ResNet is a ``GroupNorm(16, channels)``: batch statistics
mix the examples of a batch, so a per-sample gradient would depend on the other rows and
the per-sample clipping bound (hence the privacy guarantee) would not hold (App. E.7,
following Berrada et al., 2023).  GroupNorm normalises each example on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def group_norm(channels: int, groups: int) -> nn.GroupNorm:
    """The ResNets' norm layer: ``groups`` groups, capped at the channel count (narrow smoke
    models), normalising each example on its own (see the module docstring)."""
    return nn.GroupNorm(min(groups, channels), channels)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (1x1/stride projection when the
    shape changes), GroupNorm after each convolution."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.norm1 = group_norm(out_ch, groups)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.norm2 = group_norm(out_ch, groups)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), group_norm(out_ch, groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """A GroupNorm ResNet of BasicBlocks for inputs of shape (C, H, W).

    Args:
        in_channels: image channels C.
        n_classes: number of logits.
        blocks: BasicBlocks per stage (ResNet16: ``(2, 2, 2, 1)``).
        widths: channels per stage (``(64, 128, 256, 512)``; ``width`` scales them).
        groups: GroupNorm groups (16; capped at the channel count).
        stem_pool: 3x3/2 max-pool after the stem (as in torchvision's ResNets).
    """

    def __init__(
        self,
        in_channels: int,
        n_classes: int,
        *,
        blocks: Sequence[int] = (2, 2, 2, 1),
        widths: Sequence[int] = (64, 128, 256, 512),
        groups: int = 16,
        stem_pool: bool = True,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 7, stride=2, padding=3, bias=False),
            group_norm(widths[0], groups),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1) if stem_pool else nn.Identity(),
        )
        stages: list[nn.Module] = []
        in_ch = widths[0]
        for i, (n_blocks, width) in enumerate(zip(blocks, widths)):
            layers = []
            for j in range(n_blocks):
                layers.append(BasicBlock(in_ch, width, stride=2 if (i > 0 and j == 0) else 1, groups=groups))
                in_ch = width
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(in_ch, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


def resnet16(
    input_shape: tuple[int, ...],
    n_classes: int,
    *,
    width: float = 1.0,
    groups: int = 16,
    blocks: Sequence[int] = (2, 2, 2, 1),
    stem_pool: bool = True,
) -> ResNet:
    """ResNet16 (GroupNorm) for images of ``input_shape = (C, H, W)``.

    ``width`` multiplies the stage widths 64/128/256/512 (e.g. 0.25 for smoke tests); each
    width stays a multiple of ``groups``.

    Raises:
        ValueError: the input is not an image (C, H, W), or a bad width/groups.
    """
    if len(input_shape) != 3:
        raise ValueError(
            "it needs image rows of shape (C, H, W); use model=logreg or model=mlp for tabular data"
        )
    if not width > 0:
        raise ValueError(f"model.width must be > 0 (got {width})")
    if int(groups) < 1:
        raise ValueError(f"model.groups must be >= 1 (got {groups})")
    widths = tuple(max(int(groups), int(round(w * width / groups)) * int(groups)) for w in (64, 128, 256, 512))
    return ResNet(
        int(input_shape[0]), n_classes, blocks=tuple(int(b) for b in blocks), widths=widths, groups=int(groups), stem_pool=bool(stem_pool)
    )


def n_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
