"""Private checkpoint selection: report-noisy-max with Gumbel noise (``privacy.scope=model``).

The paper (App. E.2) reports the checkpoint with the highest *exact* validation accuracy
among those whose *exact* train constraint holds; both are statistics of private records, so
the released checkpoint is not covered by the training epsilon.  In ``scope=model``:

* feasibility is read from the noisy histograms training already released (post-processing,
  free; :class:`NoisyFeasibility`);
* among the feasible checkpoints, the one with the highest ``u_i + Gumbel(1/eps_sel)`` is
  reported, where ``u_i`` is checkpoint i's number of correct validation predictions.

Privacy of the second step.  Under add/remove-one of a validation record every u_i changes by
at most 1 and all in the same direction (adding a record can only add a correct prediction),
so the utility is monotone with sensitivity 1.  Gumbel-max samples exactly the exponential
mechanism ``P(i) ∝ exp(eps_sel * u_i)`` (Durfee and Rogers 2019, Lemma 4.2), which for a
monotone utility of sensitivity 1 is ``eps_sel``-DP (McSherry and Talwar 2007, Theorem 6
with the monotone refinement).  The candidate set and the models are post-processing of the
accounted training releases, so the selection composes adaptively with training.

Accounting.  A pure ``eps``-DP mechanism is dominated by binary randomized response with the
same eps (Kairouz, Oh and Viswanath 2015, Theorem 2.1), whose privacy loss takes the values
±eps with probabilities ``e^eps/(1+e^eps)`` and ``1/(1+e^eps)``.  It enters the DpEvent tree
as that randomized response, ``RandomizedResponseDpEvent(2 / (1 + e^eps_sel), 2)``;
:class:`raco_cli.privacy.accountant.RacoPLDAccountant` composes its PLD (dp-accounting accepts
the event only under replace-one; binary randomized response's PLD is the same under
add/remove).
"""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import torch

from raco_cli.privacy.mechanisms import NoiseSource, SecureNoise


def selection_event(eps: float) -> dpa.DpEvent:
    """The DpEvent of one eps-DP selection: binary randomized response with that eps."""
    return dpa.RandomizedResponseDpEvent(noise_parameter=2.0 / (1.0 + math.exp(eps)), num_buckets=2)


def gumbel(scale: float, source: NoiseSource) -> float:
    """One Gumbel(0, scale) draw ``-scale * log(-log U)`` from the run's noise source."""
    if isinstance(source, SecureNoise):
        u = float(source.uniform((1,))[0])
    else:
        u = float(torch.rand((), generator=source, dtype=torch.float64, device=source.device))
        u = min(max(u, 2.0**-53), 1.0 - 2.0**-53)  # torch.rand may return 0: keep both logs finite
    return -scale * math.log(-math.log(u))


class NoisyArgmax:
    """Streaming report-noisy-max: ``offer`` candidates one by one, ``best`` is the index of
    the highest noisy score among the eligible ones (None while there is none).

    Drawing each candidate's Gumbel noise when it is offered gives the same distribution as
    drawing all at the end, so only the current best state has to be kept.
    """

    def __init__(self, eps: float, source: NoiseSource) -> None:
        if not eps > 0:
            raise ValueError(f"selection eps must be positive, got {eps}")
        self.scale = 1.0 / eps
        self.source = source
        self.best: int | None = None
        self.best_score = -math.inf

    def noisy_score(self, count: float) -> float:
        """``count + Gumbel(1/eps)``: the release of one candidate's utility."""
        return float(count) + gumbel(self.scale, self.source)

    def offer(self, index: int, noisy_score: float, *, eligible: bool) -> None:
        if eligible and noisy_score > self.best_score:
            self.best, self.best_score = index, noisy_score


def exponential_mechanism_probabilities(counts: np.ndarray, eps: float) -> np.ndarray:
    """``P(i) ∝ exp(eps * u_i)`` (the distribution :class:`NoisyArgmax` samples; tests).

    >>> exponential_mechanism_probabilities(np.array([0.0, 0.0]), 1.0).tolist()
    [0.5, 0.5]
    """
    z = eps * (np.asarray(counts, dtype=np.float64) - np.max(counts))
    p = np.exp(z)
    return p / p.sum()
