"""Non-private constrained SGDA: exact histogram, no clipping, no noise (paper's reference).

The same loop as RaCO-DP with the privacy stages switched off.  Not private.
"""

from __future__ import annotations

from raco_cli.methods import core
from raco_cli.methods.base import MethodSpec
from raco_cli.privacy import events

NAME = "sgda"
PRIVATE = False
FLAGS = core.CoreFlags(private=False, constrained=True, hist_noise=False)


def step_event(spec: MethodSpec, sample_rate: float, *, constrained: bool = True):
    return events.non_private()


def fit(data, model, constraints, spec, *, steps, seeds, device, reporter):
    return core.run(data, model, constraints, spec, flags=FLAGS, steps=steps, seeds=seeds, device=device, reporter=reporter)


def fit_many(data, members, *, steps, device, reporter=None):
    """The runs of a group as one vectorised problem (:mod:`raco_cli.methods.batched`)."""
    from raco_cli.methods import batched

    return batched.run_core(data, members, flags=FLAGS, steps=steps, device=device, reporter=reporter)
