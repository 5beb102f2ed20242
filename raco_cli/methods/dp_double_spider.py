"""DP Double-SPIDER (DP-DRO paper, Algorithm 2) on the psi-divergence DRO objective (eq. 3).

SPIDER estimators for the dual block (eta; and lambda for the KL-constrained form) and for x,
a large-batch refresh every ``options.phase`` steps and per-record gradient-difference
corrections in between; every release clipped per record and noised (the printed algorithm
clips batch means); random-iterate output by default.  The loop and the DpEvent tree are in
:mod:`raco_cli.methods.dro.spider`::

    Composed[SelfComposed(Composed[PS(q1, G(sigma_1)), PS(q1, G(sigma_3))], ceil(T/q)),
             SelfComposed(Composed[PS(q, G(sigma_2)), PS(q, G(sigma_4))], T - ceil(T/q))]
"""

from __future__ import annotations

from raco_cli.methods.base import MethodSpec
from raco_cli.methods.dro import spider as dro_spider
from raco_cli.methods.dro.common import DroRun, require_dro

NAME = "dp_double_spider"
PRIVATE = True
DEFAULTS = dro_spider.DOUBLE_DEFAULTS


def validate(spec: MethodSpec, constraints, data=None) -> None:
    """Needs ``objective=dro`` (any divergence); options checked (one line each)."""
    require_dro(spec, name=NAME)
    dro_spider.double_options(spec)


def step_event(spec: MethodSpec, sample_rate: float, *, constrained: bool = True):
    return run_event(spec, sample_rate, 1)


def run_event(spec: MethodSpec, sample_rate: float, steps: int, *, constrained: bool = True):
    return dro_spider.double_event(spec, sample_rate, steps, dro_spider.double_options(spec))


def fit(data, model, constraints, spec, *, steps, seeds, device, reporter):
    validate(spec, constraints, data)
    run = DroRun(data, model, constraints, spec, steps=steps, seeds=seeds, device=device, reporter=reporter, private=True)
    return run.finish(dro_spider.run_double(run, dro_spider.double_options(spec)))
