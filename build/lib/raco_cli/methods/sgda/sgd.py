"""Non-private, unconstrained SGD (Poisson batches, no clipping, no noise).  Not private."""

from __future__ import annotations

from raco_cli.methods.base import MethodSpec
from raco_cli.methods.sgda import core
from raco_cli.privacy import events

NAME = "sgd"
PRIVATE = False
MIXED_STEPS = True  # fit_many takes one T per run (sgda/batched.run_core)
TASKS = ("classification", "regression")  # task=regression: squared loss on the linear model (docs/dpse.md)
FLAGS = core.CoreFlags(private=False, constrained=False, hist_noise=False)


def step_event(spec: MethodSpec, sample_rate: float, *, constrained: bool = True):
    return events.non_private()


def fit(data, model, constraints, spec, *, steps, seeds, device, reporter):
    # one path: logistic regression on the CPU trains on the batched engine
    from raco_cli.methods.sgda import batched

    return batched.run_one(data, model, constraints, spec, flags=FLAGS, steps=steps, seeds=seeds, device=device, reporter=reporter)


def fit_many(data, members, *, steps, device, reporter=None):
    """The runs of a group as one vectorised problem (:mod:`raco_cli.methods.sgda.batched`)."""
    from raco_cli.methods.sgda import batched

    return batched.run_core(data, members, flags=FLAGS, steps=steps, device=device, reporter=reporter)
