"""Model factories (``model=<name>``): nn.Modules only, no training logic.

* ``logreg``: one linear layer (closed-form per-sample gradients; the tabular default).
* ``mlp``: a small ReLU MLP (non-convex tabular runs).
* ``resnet16``: ResNet16 with GroupNorm for images (C, H, W) (paper App. E.7).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from raco_cli.errors import ConfigError, unknown_name


def _logreg(input_shape: tuple[int, ...], n_classes: int, **_: Any):
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), n_classes))


def _mlp(input_shape: tuple[int, ...], n_classes: int, *, hidden: tuple[int, ...] = (64, 64), **_: Any):
    from torch import nn

    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.ReLU()]
        width = int(h)
    layers.append(nn.Linear(width, n_classes))
    return nn.Sequential(*layers)


def _resnet16(input_shape: tuple[int, ...], n_classes: int, **opts: Any):
    from raco_cli.models.resnet import resnet16

    if "blocks" in opts:
        opts["blocks"] = tuple(opts["blocks"])
    return resnet16(input_shape, n_classes, **opts)


MODELS: dict[str, Callable[..., Any]] = {"logreg": _logreg, "mlp": _mlp, "resnet16": _resnet16}


def build(name: str, *, input_shape: tuple[int, ...], n_classes: int, options: dict[str, Any] | None = None):
    """Build a model for inputs of ``input_shape`` and ``n_classes`` outputs (logits).

    Raises:
        ConfigError: unknown model name, or a model that does not fit the data shape.
    """
    if name not in MODELS:
        raise unknown_name("model", name, MODELS)
    opts = {k: v for k, v in (options or {}).items() if k != "name"}
    if "hidden" in opts:
        opts["hidden"] = tuple(opts["hidden"])
    try:
        return MODELS[name](tuple(input_shape), int(n_classes), **opts)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model={name} cannot be built for input shape {tuple(input_shape)}: {exc}") from exc


def linear_layer(model: Any):
    """The nn.Linear of a logistic-regression model, or None for other models.

    Used to pick the closed-form per-sample gradient path.
    """
    from torch import nn

    mods = [m for m in model.modules() if not isinstance(m, (nn.Sequential, nn.Flatten))]
    if len(mods) == 1 and isinstance(mods[0], nn.Linear):
        return mods[0]
    return None
