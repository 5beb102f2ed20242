"""DP-SGDA on the minimax form of the DRO objective (eq. 2): the DP-DRO paper's baseline.

Descent on (x, eta[, lambda]) with noisy per-record-clipped gradient sums, ascent on the
per-record density ratios (hidden state, never released); loop and DpEvent tree in
:mod:`raco_cli.methods.dro.sgda`::

    SelfComposed(PoissonSampled(q, Composed[Gaussian(sigma), Gaussian(sigma_dual)]), T)
"""

from __future__ import annotations

from raco_cli.methods.base import MethodSpec
from raco_cli.methods.dro import sgda as dro_sgda
from raco_cli.methods.dro.common import DroRun, require_dro

NAME = "dp_sgda"
PRIVATE = True
DEFAULTS = dro_sgda.SGDA_DEFAULTS


def validate(spec: MethodSpec, constraints, data=None) -> None:
    """Needs ``objective=dro`` (any divergence)."""
    require_dro(spec, name=NAME)
    dro_sgda.sgda_options(spec)


def step_event(spec: MethodSpec, sample_rate: float, *, constrained: bool = True):
    return run_event(spec, sample_rate, 1)


def run_event(spec: MethodSpec, sample_rate: float, steps: int, *, constrained: bool = True):
    return dro_sgda.sgda_event(spec, sample_rate, steps, dro_sgda.sgda_options(spec))


def fit(data, model, constraints, spec, *, steps, seeds, device, reporter):
    validate(spec, constraints, data)
    run = DroRun(data, model, constraints, spec, steps=steps, seeds=seeds, device=device, reporter=reporter, private=True)
    return run.finish(dro_sgda.run_sgda(run, dro_sgda.sgda_options(spec)))
