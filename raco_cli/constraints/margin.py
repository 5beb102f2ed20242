"""Generalisation margins of rate constraints (``constraint.confidence``).

A model trained and selected to meet ``Gamma_j <= gamma_j`` on its training data meets it on
new data only up to the sampling error of the rates.  With ``constraint.confidence = c`` raco
trains and selects against ``gamma_j - m_j`` instead, with a margin per constraint

    m_j = z_{1 - (1 - c) / J'} * sqrt(s_train_j^2 + s_fresh_j^2 + s_signal_j^2)

(a union bound over the J' distinct constraints, so that all of them hold at once with
probability >= c under the normal approximation of the rate estimates).

The standard deviations.  A rate ``P_k(D_I)`` is a mean over the rows of the subset I, a union
of cells q of the partition, so ``Gamma_j = sum_I sum_k alpha_{j,I,k} P_k(D_I)`` is a sum over
cells of ``(n_q / n_I)``-weighted means of per-row values ``sum_k w_{j,q,k} 1[h(x) = k]`` with
``w_{j,q,k} = sum_{I ni q} alpha_{j,I,k} n_q / n_I``.  A cell's rows are independent of the
other cells' rows, and a per-row value lies in an interval of width ``range_k w_{j,q,k}``, so
(Popoviciu's bound on the variance of a bounded variable)

    Var(Gamma_j estimated from n rows) <= sum_q (range_k w_{j,q,k})^2 / (4 n_q).

* ``s_train``: the training rates of the released model against its rates on the whole
  distribution (n_q: the training rows of cell q);
* ``s_fresh``: "new data" is a sample the size of the held-out test split (n_q times the public
  test/train ratio of the split, :data:`TEST_PER_TRAIN`), the scale on which raco reports the
  constraint;
* ``s_signal`` (``privacy.scope=model``): the feasibility signal that picks the released
  checkpoint is a mean over ``window`` steps of rates of Poisson batches (q n_q rows of cell q:
  the sampling term above with n_q -> q n_q) read from histograms whose every (cell, class)
  count carries Laplace noise of scale b: by the delta method a count's noise moves
  ``P_k(D_I)`` by at most its noise / (q n_I), so the noise adds
  ``2 b^2 K sum_q (sum_{I ni q} sum_k |alpha_{j,I,k}| / (q n_I))^2`` per step; the window's
  mean divides the per-step variance by ``window``.  Under ``scope=paper`` feasibility is read
  from the exact training rates: no signal term.

The cell sizes n_q are never exact under ``privacy.scope=model``: they come from the released
DP counts of the partition's cells (:mod:`raco_cli.privacy.size`) lowered by two noise standard
deviations (a smaller n gives a larger margin: conservative), so the margin is post-processing
of accounted releases.  Documented, with its measured effect, in docs/methods.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from raco_cli.constraints.rate import ConstraintSet

# the shared protocol's split (raco_cli.data.tabular): test 25 % of the rows, validation 15 %
# of the rest, so test / train = 0.25 / (0.75 * 0.85)
TEST_PER_TRAIN = 0.25 / (0.75 * 0.85)


@dataclass(frozen=True)
class Signal:
    """What the feasibility signal of ``privacy.scope=model`` averages: ``window`` steps of
    Poisson batches at rate ``sample_rate``, each histogram cell with Laplace noise of scale
    ``laplace_scale`` (0: exact histograms)."""

    sample_rate: float
    window: int
    laplace_scale: float


@dataclass(frozen=True)
class Margins:
    """The margins of a run's J constraints and what they were computed from."""

    confidence: float
    margin: np.ndarray  # (J,)
    subset_rows: np.ndarray  # (M,) the subset sizes used (a lower bound under scope=model)
    z: float


def row_ranges(cons: ConstraintSet, cell_rows: np.ndarray) -> np.ndarray:
    """``range_k w_{j,q,k}`` (J, Q): the width of a row's contribution to Gamma_j, per cell."""
    n_q = np.maximum(np.asarray(cell_rows, dtype=float), 1.0)
    n_subset = cons.membership @ n_q  # (M,)
    share = cons.membership * n_q[None, :] / n_subset[:, None]  # (M, Q): n_q / n_I for q in I
    w = np.einsum("jmk,mq->jqk", cons.alpha, share)  # (J, Q, K)
    return w.max(axis=2) - w.min(axis=2)


def constraint_sd(cons: ConstraintSet, cell_rows: np.ndarray, *, sample_rate: float = 1.0) -> np.ndarray:
    """Upper bound on the sd of each Gamma_j estimated from ``sample_rate`` x the cells' rows.

    >>> from raco_cli.constraints.families import demographic_parity
    >>> cons = ConstraintSet.build(demographic_parity(n_classes=2, n_groups=2, gamma=0.05), n_classes=2, n_groups=2)
    >>> constraint_sd(cons, np.array([100.0, 400.0])).round(6).tolist()  # sqrt(1/400 + 1/1600)
    [0.055902, 0.055902, 0.055902, 0.055902]
    """
    n_q = np.maximum(np.asarray(cell_rows, dtype=float) * sample_rate, 1.0)
    return np.sqrt((row_ranges(cons, cell_rows) ** 2 / (4.0 * n_q[None, :])).sum(axis=1))


def noise_sd(cons: ConstraintSet, cell_rows: np.ndarray, *, sample_rate: float, laplace_scale: float) -> np.ndarray:
    """Upper bound on the sd the Laplace noise of one histogram adds to each Gamma_j (delta method)."""
    n_q = np.maximum(np.asarray(cell_rows, dtype=float), 1.0)
    n_subset = np.maximum(sample_rate * (cons.membership @ n_q), 1.0)  # expected batch rows of each subset
    weight = np.abs(cons.alpha).sum(axis=2) / n_subset[None, :]  # (J, M): sum_k |alpha| / (q n_I)
    per_cell = weight @ cons.membership  # (J, Q): sum over the subsets containing q
    return np.sqrt(2.0 * laplace_scale**2 * cons.K * (per_cell**2).sum(axis=1))


def distinct_constraints(cons: ConstraintSet) -> int:
    """J': the constraints that differ (a binary rate ``P_0 = 1 - P_1`` folded onto ``P_1``, so
    demographic parity's ``class 0`` rows repeat its ``class 1`` rows); at least 1.

    >>> from raco_cli.constraints.families import demographic_parity
    >>> distinct_constraints(ConstraintSet.build(demographic_parity(n_classes=2, n_groups=2, gamma=0.05), n_classes=2, n_groups=2))
    2
    """
    alpha = cons.alpha
    if cons.K == 2:  # alpha_0 P_0 + alpha_1 P_1 = alpha_0 + (alpha_1 - alpha_0) P_1
        alpha = (alpha[:, :, 1] - alpha[:, :, 0])[:, :, None]
    rows = {(round(float(g), 12), tuple(np.round(a.ravel(), 12))) for a, g in zip(alpha, cons.gamma)}
    return max(len(rows), 1)


def margins(cons: ConstraintSet, cell_rows: np.ndarray, *, confidence: float, signal: Signal | None,
            test_per_train: float = TEST_PER_TRAIN) -> Margins:
    """The margin of every constraint (module docstring).

    ``cell_rows``: training rows per cell of the partition (``cons.Q``), from released counts
    under scope=model.
    """
    rows = np.maximum(np.asarray(cell_rows, dtype=float), 1.0)
    var = constraint_sd(cons, rows) ** 2 + constraint_sd(cons, rows, sample_rate=test_per_train) ** 2
    if signal is not None:
        per_step = constraint_sd(cons, rows, sample_rate=signal.sample_rate) ** 2
        if signal.laplace_scale > 0:
            per_step = per_step + noise_sd(cons, rows, sample_rate=signal.sample_rate, laplace_scale=signal.laplace_scale) ** 2
        var = var + per_step / max(signal.window, 1)
    z = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / distinct_constraints(cons))
    return Margins(confidence=confidence, margin=z * np.sqrt(var), subset_rows=cons.membership @ rows, z=z)
