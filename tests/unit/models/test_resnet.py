"""ResNet16 (GroupNorm): architecture, parameter count, shape errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from raco_cli import models
from raco_cli.errors import ConfigError
from raco_cli.models.resnet import n_parameters


def test_resnet16_parameter_count_for_two_classes():
    model = models.build("resnet16", input_shape=(3, 64, 64), n_classes=2)
    # paper Section 6: "ResNet16 (6.4M parameters)"
    assert n_parameters(model) == 6_456_898


def test_resnet16_is_resnet18_without_its_last_basic_block():
    """Independent count: torchvision's resnet18 has 11 689 512 parameters (1000 classes; GroupNorm
    has the same affine parameters as BatchNorm); stage 4 with one BasicBlock instead of two
    drops two 3x3 512->512 convolutions and their two norms: 2 * (512*512*9 + 2*512)."""
    model = models.build("resnet16", input_shape=(3, 64, 64), n_classes=1000)
    assert n_parameters(model) == 11_689_512 - 2 * (512 * 512 * 9 + 2 * 512)


def test_resnet16_uses_groupnorm_16_and_no_batchnorm():
    model = models.build("resnet16", input_shape=(3, 32, 32), n_classes=2)
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert norms and all(m.num_groups == 16 for m in norms)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.kernel_size != (1, 1)]
    assert len(convs) == 1 + 2 * (2 + 2 + 2 + 1)  # stem + 14 block convolutions (+ head = 16 layers)
    assert convs[0].kernel_size == (7, 7) and convs[0].stride == (2, 2)


def test_resnet16_logits_shape_and_per_example_independence():
    torch.manual_seed(0)
    model = models.build("resnet16", input_shape=(3, 32, 32), n_classes=3, options={"width": 0.25})
    X = torch.randn(5, 3, 32, 32)
    z = model(X)
    assert z.shape == (5, 3)
    # GroupNorm: one example's logits do not depend on the rest of the batch
    torch.testing.assert_close(model(X[2:3]), z[2:3], rtol=1e-4, atol=1e-5)


def test_width_and_groups_options():
    model = models.build("resnet16", input_shape=(3, 16, 16), n_classes=2, options={"name": "resnet16", "width": 0.125, "groups": 4, "blocks": [1, 1, 1, 1]})
    widths = [m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert max(widths) == 64 and min(widths) == 8
    assert all(m.num_groups == 4 for m in model.modules() if isinstance(m, nn.GroupNorm))


def test_resnet16_on_tabular_rows_is_a_one_line_config_error():
    with pytest.raises(ConfigError) as info:
        models.build("resnet16", input_shape=(102,), n_classes=2)
    assert str(info.value) == (
        "model=resnet16 cannot be built for input shape (102,): it needs image rows of shape (C, H, W); "
        "use model=logreg or model=mlp for tabular data"
    )


def test_tabular_models_accept_images_by_flattening():
    for name in ("logreg", "mlp"):
        model = models.build(name, input_shape=(3, 4, 4), n_classes=2)
        assert model(torch.zeros(2, 3, 4, 4)).shape == (2, 2)
