"""RaCO-DP (Yaghini et al., ICLR 2026, Algorithm 1): private SGDA with a private histogram.

DpEvent tree of a run of T steps (see :func:`raco_cli.privacy.events.raco_step`)::

    SelfComposed(Composed[PoissonSampled(q, Laplace(b)), PoissonSampled(q, Gaussian(sigma))], T)

with ``sampling=independent`` (default), or with ``sampling=shared`` (one batch)::

    SelfComposed(PoissonSampled(q, Composed[Laplace(b), Gaussian(sigma)]), T)
"""

from __future__ import annotations

from raco_cli.methods.base import MethodSpec
from raco_cli.methods.sgda import core
from raco_cli.privacy import events

NAME = "raco_dp"
PRIVATE = True
MIXED_STEPS = True  # fit_many takes one T per run (sgda/batched.run_core)
FLAGS = core.CoreFlags(private=True, constrained=True, hist_noise=True)


def step_event(spec: MethodSpec, sample_rate: float, *, constrained: bool = True):
    if not constrained:  # no rate constraint: no histogram is released (DP-SGD)
        return events.gaussian_step(sample_rate=sample_rate, noise_multiplier=spec.required("noise_multiplier"))
    return events.raco_step(
        sample_rate=sample_rate,
        noise_multiplier=spec.required("noise_multiplier"),
        hist_noise_multiplier=spec.required("hist_noise_multiplier"),
        sampling="shared" if spec.sampling == "shared" else "independent",
    )


def fit(data, model, constraints, spec, *, steps, seeds, device, reporter):
    # one path: logistic regression on the CPU trains on the batched engine
    from raco_cli.methods.sgda import batched

    return batched.run_one(data, model, constraints, spec, flags=FLAGS, steps=steps, seeds=seeds, device=device, reporter=reporter)


def fit_many(data, members, *, steps, device, reporter=None):
    """The runs of a group as one vectorised problem (:mod:`raco_cli.methods.sgda.batched`)."""
    from raco_cli.methods.sgda import batched

    return batched.run_core(data, members, flags=FLAGS, steps=steps, device=device, reporter=reporter)
