"""Non-private SGDA: the reference of the private descent-ascent methods.  Not private.

* ``objective=erm``: constrained SGDA, exact histogram, no clipping, no noise (RaCO-DP's
  reference): the same loop as RaCO-DP with the privacy stages switched off.
* ``objective=dro``: SGDA on the DRO minimax form (:mod:`raco_cli.methods.dro.sgda`), DP-SGDA's
  loop without clipping or noise (``options.lr_ratio``: the ratios' ascent step).
"""

from __future__ import annotations

from raco_cli.methods.base import MethodSpec
from raco_cli.methods.dro import sgda as dro_sgda
from raco_cli.methods.dro.common import DroRun
from raco_cli.methods.sgda import core
from raco_cli.privacy import events

NAME = "sgda"
PRIVATE = False
MIXED_STEPS = True  # fit_many takes one T per run (sgda/batched.run_core)
FLAGS = core.CoreFlags(private=False, constrained=True, hist_noise=False)


def step_event(spec: MethodSpec, sample_rate: float, *, constrained: bool = True):
    return events.non_private()


def validate(spec: MethodSpec, constraints, data=None) -> None:
    if spec.objective.is_dro:
        dro_sgda.sgda_options(spec)


def fit(data, model, constraints, spec, *, steps, seeds, device, reporter):
    if spec.objective.is_dro:
        o = dro_sgda.sgda_options(spec)
        run = DroRun(data, model, constraints, spec, steps=steps, seeds=seeds, device=device, reporter=reporter, private=False,
                     clipped=o["clipped"])
        return run.finish(dro_sgda.run_sgda(run, o))
    # one path: logistic regression on the CPU trains on the batched engine
    from raco_cli.methods.sgda import batched

    return batched.run_one(data, model, constraints, spec, flags=FLAGS, steps=steps, seeds=seeds, device=device, reporter=reporter)


def fit_many(data, members, *, steps, device, reporter=None):
    """The runs of a group as one vectorised problem (:mod:`raco_cli.methods.sgda.batched`)."""
    from raco_cli.methods.sgda import batched

    return batched.run_core(data, members, flags=FLAGS, steps=steps, device=device, reporter=reporter)
