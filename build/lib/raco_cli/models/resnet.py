"""GroupNorm ResNets for private image classification: one :class:`ResNet` (a stem, stages of
BasicBlocks, global average pooling, a linear head) and the two models built from it, which
differ only in their stem and stages.

* ``resnet16``, the architecture of the paper's CelebA experiment (Section 6, App. E.7): the
  ImageNet stem of He et al. (2016), a 7x7/2 convolution and a 3x3/2 max-pool, then BasicBlock
  stages ``[2, 2, 2, 1]`` at widths ``64/128/256/512`` (strides 1/2/2/2): 14 block convolutions
  + stem + head = 16 weight layers, about 6.4 M parameters for 2 classes.
* ``resnet20``, the CIFAR ResNet of He et al. (2016, Section 4.2) used by the DP-DRO paper's
  image experiments: a 3x3 stem convolution with 16 channels at full resolution, three stages
  of 3 BasicBlocks at widths 16/32/64 (strides 1/2/2): 6n + 2 = 20 weight layers, about
  0.27 M parameters.

The shortcut of a block that changes shape is a 1x1 convolution (option B of He et al.).
Every BatchNorm of the standard ResNets is a ``GroupNorm(16, channels)``: batch statistics mix
the examples of a batch, so a per-sample gradient would depend on the other rows and the
per-sample clipping bound (hence the privacy guarantee) would not hold (App. E.7, following
Berrada et al., 2023).  GroupNorm normalises each example on its own.
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


def imagenet_stem(in_channels: int, width: int, groups: int, *, pool: bool = True) -> nn.Sequential:
    """ResNet16's stem: a 7x7/2 convolution, GroupNorm, ReLU and (``pool``, as in torchvision's
    ResNets) a 3x3/2 max-pool, so that the stages see a quarter of the resolution."""
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False),
        group_norm(width, groups),
        nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1) if pool else nn.Identity(),
    )


def cifar_stem(in_channels: int, width: int, groups: int) -> nn.Sequential:
    """ResNet20's stem: one 3x3 convolution, GroupNorm and ReLU at full resolution (32x32
    images are small enough to keep it)."""
    return nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False), group_norm(width, groups), nn.ReLU())


class ResNet(nn.Module):
    """A GroupNorm ResNet of BasicBlocks: ``stem``, then the stages (the first block of every
    stage but the first halves the resolution), global average pooling and a linear head.

    Args:
        stem: the layers before the first stage (:func:`imagenet_stem`, :func:`cifar_stem`);
            it returns ``widths[0]`` channels.
        n_classes: number of logits.
        blocks: BasicBlocks per stage (ResNet16: ``(2, 2, 2, 1)``, ResNet20: ``(3, 3, 3)``).
        widths: channels per stage.
        groups: GroupNorm groups (capped at the channel count).
    """

    def __init__(self, stem: nn.Module, n_classes: int, *, blocks: Sequence[int], widths: Sequence[int], groups: int = 16) -> None:
        super().__init__()
        self.stem = stem
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


def _check_image_options(input_shape: tuple[int, ...], width: float, groups: int) -> None:
    if len(input_shape) != 3:
        raise ValueError(
            "it needs image rows of shape (C, H, W); use model=logreg or model=mlp for tabular data"
        )
    if not width > 0:
        raise ValueError(f"model.width must be > 0 (got {width})")
    if int(groups) < 1:
        raise ValueError(f"model.groups must be >= 1 (got {groups})")


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
    width stays a multiple of ``groups``.  ``stem_pool``: the stem's max-pool.

    Raises:
        ValueError: the input is not an image (C, H, W), or a bad width/groups.
    """
    _check_image_options(input_shape, width, groups)
    widths = tuple(max(int(groups), int(round(w * width / groups)) * int(groups)) for w in (64, 128, 256, 512))
    stem = imagenet_stem(int(input_shape[0]), widths[0], int(groups), pool=bool(stem_pool))
    return ResNet(stem, n_classes, blocks=tuple(int(b) for b in blocks), widths=widths, groups=int(groups))


def resnet20(input_shape: tuple[int, ...], n_classes: int, *, width: float = 1.0, groups: int = 16) -> ResNet:
    """ResNet20 (GroupNorm) for images of ``input_shape = (C, H, W)``.

    ``width`` multiplies the stage widths 16/32/64, each then a multiple of ``groups``; at 1.0
    the widths stay 16/32/64 whatever ``groups`` (the norm caps its groups at the channels).

    Raises:
        ValueError: the input is not an image, or a bad width / groups.
    """
    _check_image_options(input_shape, width, groups)
    groups, width = int(groups), float(width)
    widths = [max(groups, int(round(w * width / groups)) * groups) if width != 1.0 else w for w in (16, 32, 64)]
    return ResNet(cifar_stem(int(input_shape[0]), widths[0], groups), n_classes, blocks=(3, 3, 3), widths=widths, groups=groups)


def n_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
