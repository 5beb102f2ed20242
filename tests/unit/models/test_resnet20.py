"""ResNet20 (GroupNorm): the CIFAR architecture, and no mixing of records within a batch."""

from __future__ import annotations

import pytest
import torch

from raco_cli import models
from raco_cli.errors import ConfigError
from raco_cli.models.resnet import n_parameters


def test_resnet20_shape_and_size():
    m = models.build("resnet20", input_shape=(3, 32, 32), n_classes=10)
    assert 0.26e6 < n_parameters(m) < 0.28e6  # He et al. 2016: 0.27 M
    convs = [x for x in m.modules() if isinstance(x, torch.nn.Conv2d) and x.kernel_size == (3, 3)]
    assert len(convs) + 1 == 20  # 19 3x3 convolutions + the linear head
    assert not any(isinstance(x, torch.nn.modules.batchnorm._BatchNorm) for x in m.modules())
    assert models.build("resnet20", input_shape=(1, 8, 8), n_classes=2)(torch.zeros(3, 1, 8, 8)).shape == (3, 2)


def test_rows_do_not_interact():
    torch.manual_seed(0)
    m = models.build("resnet20", input_shape=(1, 8, 8), n_classes=2, options={"width": 0.5, "groups": 4})
    x = torch.randn(4, 1, 8, 8)
    torch.testing.assert_close(m(x)[:1], m(x[:1]), atol=1e-5, rtol=1e-5)


def test_resnet20_refuses_tables():
    with pytest.raises(ConfigError, match="model=resnet20 cannot be built for input shape"):
        models.build("resnet20", input_shape=(10,), n_classes=2)
