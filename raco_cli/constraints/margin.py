"""Generalisation margins of rate constraints (``constraint.confidence``).

A model trained and selected to meet ``Gamma_j <= gamma_j`` on its training data meets it on
new data only up to the sampling error of the rates.  With ``constraint.confidence = c`` raco
trains and selects against ``gamma_j - m_j`` instead, with a margin per constraint.

The margin.  Write ``G`` for the released model's estimate of a statistic (what training and
selection read) and ``F`` for its value on a fresh sample, with ``F - G ~ N(0, s^2)``,
``s^2 = s_train^2 + s_fresh^2 + s_signal^2`` (the normal approximation of the rate estimates).
Training drives a binding constraint to its target, so take ``G = gamma - m`` there: the model
then fails on fresh data if ``F - G > m``, probability ``Phi(-m / s)``.  Most rate constraints
come in pairs, one statistic bounded from both sides (demographic parity's ``P_1(a) - P_1(b)
<= gamma`` and ``P_1(b) - P_1(a) <= gamma'``); at ``G = gamma - m`` the other side fails if
``G - F > gamma + gamma' - m = 2h - m`` (h: the half-width of the interval), so a pair fails
with probability ``Phi(-m / s) + Phi(-(2h - m) / s)``, largest at either end of the interval,
and m is its root at ``delta``:

    Phi(-m / s) + Phi(-(2h - m) / s) = delta        (a pair: m in [0, h], by bisection),
    m = s * z_{1 - delta}                           (a statistic bounded from one side),

with ``delta = (1 - c) / S`` (a union bound over the S distinct statistics, so that all of them
hold at once with probability >= c).  Binary rates are folded first (``P_0 = 1 - P_1``), so
demographic parity over two groups is one statistic, S = 1, and ``m = 1.28 s`` wherever
``h >> s`` (counting the two sides as two constraints of a union bound gave ``1.64 s``).  When
``2 Phi(-h / s) > delta`` even a model centred in the interval fails too often; the margin is
then the two-sided ``s * z_{1 - delta / 2}``, which exceeds h: the run declines
(raco_cli/run/prepare.py ``with_margins``).

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
    z: np.ndarray  # (J,) m_j / s_j


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


def _folded(cons: ConstraintSet) -> tuple[np.ndarray, np.ndarray]:
    """Each constraint as ``a_j . P <= g_j`` over free rates: (J, M*K') coefficients and (J,)
    bounds.  A binary rate is folded onto ``P_1`` (``alpha_0 P_0 + alpha_1 P_1 = alpha_0 +
    (alpha_1 - alpha_0) P_1``), its constant moved into the bound."""
    if cons.K == 2:
        alpha = cons.alpha
        return alpha[:, :, 1] - alpha[:, :, 0], cons.gamma - alpha[:, :, 0].sum(axis=1)
    return cons.alpha.reshape(cons.J, -1), np.asarray(cons.gamma, dtype=float)


@dataclass(frozen=True)
class Statistic:
    """One statistic ``a . P`` and the constraints that bound it: ``upper`` (``a . P <= g``) and
    ``lower`` (``-a . P <= g``) list constraint indices; ``half_width`` is h of a pair (None for
    a statistic bounded from one side)."""

    upper: tuple[int, ...]
    lower: tuple[int, ...]
    half_width: float | None

    @property
    def members(self) -> tuple[int, ...]:
        return self.upper + self.lower


def statistics(cons: ConstraintSet) -> list[Statistic]:
    """The distinct statistics the constraints bound, a statistic's sign folded into its side.

    >>> from raco_cli.constraints.families import demographic_parity
    >>> [(s.upper, s.lower, s.half_width) for s in statistics(ConstraintSet.build(
    ...     demographic_parity(n_classes=2, n_groups=2, gamma=0.05), n_classes=2, n_groups=2))]
    [((1, 2), (0, 3), 0.05)]
    """
    coef, bound = _folded(cons)
    groups: dict[tuple[float, ...], tuple[list[int], list[int]]] = {}
    for j, a in enumerate(np.round(coef, 12)):
        nonzero = np.flatnonzero(a)
        sign = 1.0 if nonzero.size == 0 or a[nonzero[0]] > 0 else -1.0
        key = tuple((sign * a + 0.0).tolist())  # + 0.0: no negative zeros in the key
        upper, lower = groups.setdefault(key, ([], []))
        (upper if sign > 0 else lower).append(j)
    found = []
    for upper, lower in groups.values():
        h = (float(bound[upper].min()) + float(bound[lower].min())) / 2 if upper and lower else None
        found.append(Statistic(tuple(upper), tuple(lower), h))
    return found


def distinct_constraints(cons: ConstraintSet) -> int:
    """S: the distinct statistics the constraints bound (both sides of one counting once), at
    least 1: the union bound's count.

    >>> from raco_cli.constraints.families import demographic_parity
    >>> distinct_constraints(ConstraintSet.build(demographic_parity(n_classes=2, n_groups=2, gamma=0.05), n_classes=2, n_groups=2))
    1
    """
    return max(len(statistics(cons)), 1)


def _margin(s: float, delta: float, half_width: float | None) -> tuple[float, float]:
    """(m, z = m / s) of one statistic (module docstring)."""
    normal = NormalDist()
    if half_width is None:
        z = normal.inv_cdf(1.0 - delta)
        return z * s, z
    z_centre = normal.inv_cdf(1.0 - delta / 2)
    h = half_width / s  # in units of s
    if h <= z_centre:  # 2 Phi(-h) >= delta: a centred model already fails too often
        return z_centre * s, z_centre
    lo, hi = 0.0, h  # risk(z) = Phi(-z) + Phi(-(2h - z)) falls on [0, h]
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if normal.cdf(-mid) + normal.cdf(-(2 * h - mid)) > delta else (lo, mid)
    return hi * s, hi


def margins(cons: ConstraintSet, cell_rows: np.ndarray, *, confidence: float, signal: Signal | None,
            test_per_train: float = TEST_PER_TRAIN) -> Margins:
    """The margin of every constraint (module docstring): one per statistic, shared by the
    constraints that bound it.

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
    found = statistics(cons)
    delta = (1.0 - confidence) / max(len(found), 1)
    margin, z = np.zeros(cons.J), np.zeros(cons.J)
    for stat in found:
        idx = list(stat.members)
        margin[idx], z[idx] = _margin(float(np.sqrt(var[idx].max())), delta, stat.half_width)
    return Margins(confidence=confidence, margin=margin, subset_rows=cons.membership @ rows, z=z)
