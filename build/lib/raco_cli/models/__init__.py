"""Model factories (``model=<name>``): nn.Modules only, no training logic.

* ``logreg``: one linear layer (closed-form per-sample gradients; the tabular default).
* ``linear``: the same layer with an optional bias (``model.bias``): linear regression under
  ``task=regression`` (the DPSE paper's ``<theta, x>`` has no intercept: ``bias: false``).
* ``mlp``: a small ReLU MLP (non-convex tabular runs).
* ``resnet16``: ResNet16 with GroupNorm for images (C, H, W) (paper App. E.7).
* ``resnet20``: the CIFAR ResNet20 with GroupNorm (the DP-DRO paper's image model).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from raco_cli.errors import ConfigError, unknown_name


def _logreg(input_shape: tuple[int, ...], n_classes: int):
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), n_classes))


def _linear(input_shape: tuple[int, ...], n_classes: int, *, bias: bool = True):
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), n_classes, bias=bias))


def _mlp(input_shape: tuple[int, ...], n_classes: int, *, hidden: tuple[int, ...] = (64, 64)):
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


def _resnet20(input_shape: tuple[int, ...], n_classes: int, **opts: Any):
    from raco_cli.models.resnet import resnet20

    return resnet20(input_shape, n_classes, **opts)


MODELS: dict[str, Callable[..., Any]] = {"logreg": _logreg, "linear": _linear, "mlp": _mlp, "resnet16": _resnet16, "resnet20": _resnet20}
# the model.* keys each model accepts (besides ``name``)
OPTIONS: dict[str, tuple[str, ...]] = {
    "logreg": (),
    "linear": ("bias",),
    "mlp": ("hidden",),
    "resnet16": ("width", "groups", "blocks", "stem_pool"),
    "resnet20": ("width", "groups"),
}
MAX_WIDTH = 1_000_000


def _check_hidden(name: str, hidden: object) -> tuple[int, ...]:
    if not isinstance(hidden, (list, tuple)) or not all(
        isinstance(h, int) and not isinstance(h, bool) and 0 < h <= MAX_WIDTH for h in hidden
    ):
        raise ConfigError(
            f"model.hidden must be a list of layer widths, integers in 1..{MAX_WIDTH} (got model.hidden={hidden!r}); "
            f"e.g. model.hidden=[64,64] for model={name}."
        )
    return tuple(hidden)


def build(name: str, *, input_shape: tuple[int, ...], n_classes: int, options: dict[str, Any] | None = None):
    """Build a model for inputs of ``input_shape`` and ``n_classes`` outputs (logits).

    Raises:
        ConfigError: unknown model name, or a model that does not fit the data shape.
    """
    if name not in MODELS:
        raise unknown_name("model", name, MODELS)
    opts = {k: v for k, v in (options or {}).items() if k != "name"}
    allowed = OPTIONS.get(name)
    if allowed is not None:
        unknown = sorted(set(opts) - set(allowed))
        if unknown:
            raise ConfigError(
                f"Unknown key model.{unknown[0]} for model={name}. Allowed: {', '.join('model.' + a for a in allowed) or 'none'}."
            )
    if "hidden" in opts:
        opts["hidden"] = _check_hidden(name, opts["hidden"])
    if "bias" in opts and not isinstance(opts["bias"], bool):
        raise ConfigError(f"model.bias must be true or false (got model.bias={opts['bias']!r}); whether the linear model has an intercept.")
    try:
        model = MODELS[name](tuple(input_shape), int(n_classes), **opts)
    except (TypeError, ValueError, RuntimeError, MemoryError) as exc:
        raise ConfigError(f"model={name} cannot be built for input shape {tuple(input_shape)}: {_first_line(exc)}") from None
    check_fits(name, model, tuple(input_shape), int(n_classes))
    return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_fits(name: str, model: Any, input_shape: tuple[int, ...], n_classes: int) -> None:
    """A dry forward pass on one zero example: the model must accept the data's example
    shape and return ``n_classes`` logits (else one line, before any run starts).

    Raises:
        ConfigError: the model does not fit the data shape.
    """
    import torch

    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = model(torch.zeros((1, *input_shape)))
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        raise ConfigError(
            f"model={name} does not fit the data: examples have shape {input_shape}, and the forward pass fails "
            f"with: {_first_line(exc)}. Choose a model for this input shape (model=logreg or model=mlp for tables)."
        ) from None
    if tuple(out.shape) != (1, n_classes):
        raise ConfigError(
            f"model={name} does not fit the data: it returns outputs of shape {tuple(out.shape[1:])} per example, "
            f"the data has {n_classes} classes."
        )


def linear_layer(model: Any):
    """The nn.Linear of a logistic- or linear-regression model, or None for other models.

    Used to pick the closed-form per-sample gradient path.
    """
    from torch import nn

    mods = [m for m in model.modules() if not isinstance(m, (nn.Sequential, nn.Flatten))]
    if len(mods) == 1 and isinstance(mods[0], nn.Linear):
        return mods[0]
    return None
