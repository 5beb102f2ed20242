"""Non-private SPIDER on the DRO objective: the reference of the two DP SPIDER methods.

``options.variant``: ``double`` (Algorithm 2 on eq. 3, any divergence) or ``recursive``
(Algorithm 3 on eq. 5, divergence kl), with no clipping and no noise; the other options are
the private methods' (their noise and clip keys are accepted and unused).  Not private.
"""

from __future__ import annotations

from typing import Any

from raco_cli.errors import ConfigError
from raco_cli.methods.base import MethodSpec
from raco_cli.methods.dro import spider as dro_spider
from raco_cli.methods.dro.common import DroRun, require_dro
from raco_cli.privacy import events

NAME = "spider"
PRIVATE = False
DEFAULTS: dict[str, Any] = {**dro_spider.DOUBLE_DEFAULTS, **dro_spider.RECURSIVE_DEFAULTS, "variant": "double"}


def _variant(spec: MethodSpec) -> str:
    variant = dict(spec.options).get("variant", "double")
    if variant not in ("double", "recursive"):
        raise ConfigError(f"method.options.variant must be one of double, recursive (got method.options.variant={variant!r}); "
                          "Algorithm 2 (double) or Algorithm 3 (recursive, divergence kl).")
    return str(variant)


def options(spec: MethodSpec) -> dict[str, Any]:
    o = dro_spider.recursive_options(spec, DEFAULTS)
    o.update(dro_spider.double_options(spec, DEFAULTS))
    return o


def validate(spec: MethodSpec, constraints, data=None) -> None:
    require_dro(spec, name=NAME, kl_only=_variant(spec) == "recursive")
    options(spec)


def step_event(spec: MethodSpec, sample_rate: float, *, constrained: bool = True):
    return events.non_private()


def fit(data, model, constraints, spec, *, steps, seeds, device, reporter):
    validate(spec, constraints, data)
    run = DroRun(data, model, constraints, spec, steps=steps, seeds=seeds, device=device, reporter=reporter, private=False)
    o = options(spec)
    dual = dro_spider.run_recursive(run, o) if _variant(spec) == "recursive" else dro_spider.run_double(run, o)
    return run.finish(dual)
