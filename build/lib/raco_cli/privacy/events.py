"""DpEvent trees of the training methods: what each step releases, for the accountant.

Every data-touching release of a method is one leaf here; the accountant never sees
anything else, so a release missing from these trees would be unaccounted.

Conventions (dp-accounting's): ``noise_multiplier`` of a Gaussian is std / l2-sensitivity;
the ``noise_multiplier`` of a Laplace event is its scale b / l1-sensitivity.  The histogram
has l1 sensitivity 1, so our ``hist_noise_multiplier`` *is* the Laplace scale b.  The paper
writes ``Lap(1/b_paper)`` (Algorithm 1, line 5), so ``hist_noise_multiplier = 1 / b_paper``.
"""

from __future__ import annotations

from typing import Literal

import dp_accounting as dpa

Sampling = Literal["independent", "shared"]
SAMPLING_MODES: tuple[str, ...] = ("independent", "shared")


def raco_step(
    *,
    sample_rate: float,
    noise_multiplier: float,
    hist_noise_multiplier: float,
    sampling: Sampling,
) -> dpa.DpEvent:
    """One RaCO-DP step: a Laplace histogram and a Gaussian gradient sum.

    * ``independent``: two independent Poisson samples at rate q, one per release::

        Composed[PoissonSampled(q, Laplace(b)), PoissonSampled(q, Gaussian(sigma))]

    * ``shared``: one Poisson sample feeds both releases (paper Algorithm 1)::

        PoissonSampled(q, Composed[Laplace(b), Gaussian(sigma)])

      dp-accounting's PLD accountant rejects this tree; :class:`RacoPLDAccountant` accounts
      it exactly with the joint PLD of :mod:`raco_cli.privacy.joint_pld`.
    """
    laplace = dpa.LaplaceDpEvent(hist_noise_multiplier)
    gaussian = dpa.GaussianDpEvent(noise_multiplier)
    if sampling == "independent":
        return dpa.ComposedDpEvent(
            [dpa.PoissonSampledDpEvent(sample_rate, laplace), dpa.PoissonSampledDpEvent(sample_rate, gaussian)]
        )
    if sampling == "shared":
        return dpa.PoissonSampledDpEvent(sample_rate, dpa.ComposedDpEvent([laplace, gaussian]))
    raise ValueError(f"unknown sampling mode {sampling!r}")


def gaussian_step(*, sample_rate: float, noise_multiplier: float) -> dpa.DpEvent:
    """One DP-SGD step: ``PoissonSampled(q, Gaussian(sigma))``."""
    return dpa.PoissonSampledDpEvent(sample_rate, dpa.GaussianDpEvent(noise_multiplier))


def repeated(step: dpa.DpEvent, steps: int) -> dpa.DpEvent:
    """``SelfComposed(step, T)``."""
    return dpa.SelfComposedDpEvent(step, int(steps))


def non_private() -> dpa.DpEvent:
    """A release without noise (non-private methods): epsilon is infinite."""
    return dpa.NonPrivateDpEvent()
