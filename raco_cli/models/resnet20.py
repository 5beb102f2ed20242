"""ResNet20 with GroupNorm: the CIFAR ResNet of He et al. (2016, Section 4.2) used by the
DP-DRO paper's image experiments.

A 3x3 convolution with 16 channels, three stages of n = 3 BasicBlocks at widths 16/32/64
(strides 1/2/2), global average pooling and a linear head: 6n + 2 = 20 weight layers, about
0.27 M parameters.  The shortcut of a block that changes shape is a 1x1 convolution (option B
of the paper).  Every BatchNorm is a ``GroupNorm(min(groups, C), C)``: batch statistics would
make one record's gradient depend on the others and break per-record clipping (the reason
:mod:`raco_cli.models.resnet` uses GroupNorm too).
"""

from __future__ import annotations

import torch
from torch import nn

from raco_cli.models.resnet import BasicBlock, group_norm


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for inputs (C, H, W); ``width`` multiplies 16/32/64."""

    def __init__(self, in_channels: int, n_classes: int, *, n: int = 3, width: float = 1.0, groups: int = 16) -> None:
        super().__init__()
        widths = [max(groups, int(round(w * width / groups)) * groups) if width != 1.0 else w for w in (16, 32, 64)]
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False), group_norm(widths[0], groups), nn.ReLU())
        stages: list[nn.Module] = []
        in_ch = widths[0]
        for i, w in enumerate(widths):
            blocks = []
            for j in range(n):
                blocks.append(BasicBlock(in_ch, w, stride=2 if (i > 0 and j == 0) else 1, groups=groups))
                in_ch = w
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(in_ch, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


def resnet20(input_shape: tuple[int, ...], n_classes: int, *, width: float = 1.0, groups: int = 16) -> CifarResNet:
    """ResNet20 (GroupNorm) for images of ``input_shape = (C, H, W)``.

    Raises:
        ValueError: the input is not an image, or a bad width / groups.
    """
    if len(input_shape) != 3:
        raise ValueError("it needs image rows of shape (C, H, W); use model=logreg or model=mlp for tabular data")
    if not width > 0:
        raise ValueError(f"model.width must be > 0 (got {width})")
    if int(groups) < 1:
        raise ValueError(f"model.groups must be >= 1 (got {groups})")
    return CifarResNet(int(input_shape[0]), n_classes, n=3, width=float(width), groups=int(groups))
