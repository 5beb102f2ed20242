"""DP-SGD (Abadi et al. 2016) with Poisson sampling: RaCO-DP's loop without histogram or dual.

Same clipping semantics as Opacus (per-sample clip to C, N(0, (sigma C)^2) on the sum, divided
by the expected batch size q|D|).  DpEvent tree::

    SelfComposed(PoissonSampled(q, Gaussian(sigma)), T)
"""

from __future__ import annotations

from raco_cli.methods.base import MethodSpec
from raco_cli.methods.sgda import core
from raco_cli.privacy import events

NAME = "dp_sgd"
PRIVATE = True
MIXED_STEPS = True  # fit_many takes one T per run (sgda/batched.run_core)
TASKS = ("classification", "regression")  # task=regression: squared loss on the linear model (docs/dpse.md)
FLAGS = core.CoreFlags(private=True, constrained=False, hist_noise=False)


def step_event(spec: MethodSpec, sample_rate: float, *, constrained: bool = True):
    return events.gaussian_step(sample_rate=sample_rate, noise_multiplier=spec.required("noise_multiplier"))


def fit(data, model, constraints, spec, *, steps, seeds, device, reporter):
    # one path: logistic regression on the CPU trains on the batched engine
    from raco_cli.methods.sgda import batched

    return batched.run_one(data, model, constraints, spec, flags=FLAGS, steps=steps, seeds=seeds, device=device, reporter=reporter)


def fit_many(data, members, *, steps, device, reporter=None):
    """The runs of a group as one vectorised problem (:mod:`raco_cli.methods.sgda.batched`)."""
    from raco_cli.methods.sgda import batched

    return batched.run_core(data, members, flags=FLAGS, steps=steps, device=device, reporter=reporter)
