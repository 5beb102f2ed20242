"""DP Recursive-SPIDER (DP-DRO paper, Algorithm 3) on the KL-constrained DRO objective (eq. 5).

``w = (x, lambda)``: private SPIDER estimators of ``mean grad_x g`` (v) and ``mean dg/dlambda`` (u)
with ``g_i = exp(l_i / lambda)`` (refresh every ``options.phase`` steps, per-record differences in
between), a STORM estimate s of the inner mean on its own Poisson batch (line 16), and the step
``z_t`` of line 18.  Loop and DpEvent tree in :mod:`raco_cli.methods.dro.spider`::

    Composed[SelfComposed(Composed[PS(q1, G(sigma_1)), PS(q1, G(sigma_3)), PS(q5, G(sigma_s))], ceil(T/q)),
             SelfComposed(Composed[PS(q, G(sigma_2)), PS(q, G(sigma_4)), PS(q5, G(sigma_s))], T - ceil(T/q))]
"""

from __future__ import annotations

from raco_cli.methods.base import MethodSpec
from raco_cli.methods.dro import spider as dro_spider
from raco_cli.methods.dro.common import DroRun, require_dro

NAME = "dp_recursive_spider"
PRIVATE = True
DEFAULTS = dro_spider.RECURSIVE_DEFAULTS


def validate(spec: MethodSpec, constraints, data=None) -> None:
    """Needs ``objective=dro`` with ``divergence=kl`` (eq. 5)."""
    require_dro(spec, name=NAME, kl_only=True)
    dro_spider.recursive_options(spec)


def step_event(spec: MethodSpec, sample_rate: float, *, constrained: bool = True):
    return run_event(spec, sample_rate, 1)


def run_event(spec: MethodSpec, sample_rate: float, steps: int, *, constrained: bool = True):
    return dro_spider.recursive_event(spec, sample_rate, steps, dro_spider.recursive_options(spec))


def fit(data, model, constraints, spec, *, steps, seeds, device, reporter):
    validate(spec, constraints, data)
    run = DroRun(data, model, constraints, spec, steps=steps, seeds=seeds, device=device, reporter=reporter, private=True)
    return run.finish(dro_spider.run_recursive(run, dro_spider.recursive_options(spec)))
