"""PrivateDiff Minimax (Zhang, Lei, Ding, Xiang, Xu, Wang, AAAI 2025, Algorithm 3) on the DRO
minimax form: the DP-DRO paper's second baseline.

Gradient-difference (restart every ``options.phase`` rounds) estimators of the min variables
(x, eta[, lambda]) with clip norms ``C2 |x_r - x_{r-1}| + C3`` on corrections, and
``options.inner_steps`` ascent steps on the sampled records' density ratios per round.  How
it follows the published update, and where it departs (same-record differences, per-record
clipping, Poisson sampling, no output perturbation of the never-released dual), is in
:mod:`raco_cli.methods.dro.sgda`.  DpEvent tree::

    Composed[SelfComposed(PS(q, Composed[G(sigma_1), G(sigma_dual)]), ceil(T/q)),
             SelfComposed(PS(q, Composed[G(sigma_2), G(sigma_dual_diff)]), T - ceil(T/q))]
"""

from __future__ import annotations

from raco_cli.methods.base import MethodSpec
from raco_cli.methods.dro import sgda as dro_sgda
from raco_cli.methods.dro.common import DroRun, require_dro

NAME = "dp_private_diff"
PRIVATE = True
DEFAULTS = dro_sgda.DIFF_DEFAULTS


def validate(spec: MethodSpec, constraints, data=None) -> None:
    """Needs ``objective=dro`` (any divergence)."""
    require_dro(spec, name=NAME)
    dro_sgda.diff_options(spec)


def step_event(spec: MethodSpec, sample_rate: float, *, constrained: bool = True):
    return run_event(spec, sample_rate, 1)


def run_event(spec: MethodSpec, sample_rate: float, steps: int, *, constrained: bool = True):
    return dro_sgda.diff_event(spec, sample_rate, steps, dro_sgda.diff_options(spec))


def fit(data, model, constraints, spec, *, steps, seeds, device, reporter):
    validate(spec, constraints, data)
    run = DroRun(data, model, constraints, spec, steps=steps, seeds=seeds, device=device, reporter=reporter, private=True)
    return run.finish(dro_sgda.run_private_diff(run, dro_sgda.diff_options(spec)))
