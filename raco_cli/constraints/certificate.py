"""The certificate of a released model (``constraint.confidence``): its rate constraints
checked on the validation split, after training, for the very model that is released.

The generalisation margins (:mod:`raco_cli.constraints.margin`) choose the *training target*
``gamma - m`` before training, from sizes alone; whether the released model then meets gamma on
new data is a property of that model, and this module measures it.  The model is fixed before
the validation rows are read (they fit nothing; a selection among checkpoints that reads them is
covered by a union bound, below), so its validation rates are an unbiased sample of its rates.

The release.  The validation rows' counts ``c_{q,k}`` (cell q of the constraint's partition,
predicted class k) of the released model's hard predictions, one exact integer per (cell,
class): under ``privacy.scope=model`` each released as ``c_{q,k} + Z``, Z from the discrete
Gaussian (:mod:`raco_cli.privacy.certificate`).  Elsewhere (scope=paper, non-private methods:
records that hold exact statistics anyway) the exact counts, no noise.

The statistic.  ``Gamma_j`` (paper eq. 12) of the counts is the estimate ``G_j`` of the model's
rate; write ``F_j`` for its value on a fresh sample of the test split's size.  To first order
(the normal approximation the margins use)

    F_j - G_j ~ N(0, s_j^2),   s_j^2 = s_fresh^2 + s_val^2 + s_noise^2,

* ``s_val^2 = sum_q r_{jq}^2 v_q / n_q`` and ``s_fresh^2`` the same with ``n_q`` times the
  public fresh/validation ratio of the split (:data:`FRESH_PER_VAL`): r_{jq} the width of a
  row's contribution to Gamma_j (:func:`raco_cli.constraints.margin.row_ranges`), ``v_q`` the
  variance of a 0/1 prediction, ``p (1 - p)`` at the released cell rate p moved up to two noise
  sds towards 1/2 (two classes), else Popoviciu's 1/4; ``n_q`` the released cell size lowered
  by two noise sds (smaller n, larger s: conservative);
* ``s_noise^2 = sigma_Z^2 sum_{q,k} (dGamma_j / dc_{q,k})^2`` (the delta method; sigma_Z the
  discrete Gaussian's scale, an upper bound on its sd).

The rule.  A statistic bounded on both sides (``l <= G <= u``: the pairs of
:func:`raco_cli.constraints.margin.statistics`, width ``2h = u - l``) is certified when
``l + z s <= G <= u - z s``; one bounded on one side when ``G <= u - z s``.  For any true rate,
the chance that it is certified *and* the fresh sample fails is at most

    B(z) = Phi(-z) + min(Phi(-z), Phi(-(2h / s_fresh - z)))     (a pair),   Phi(-z)   (one side):

a side that fails is beyond ``G + z s`` (``Phi(-z)`` for either side), and both sides can only be
near-failing at once when the interval is narrow against the fresh sample's own spread (the
second term: the true rate at distance ``z s_fresh`` from one end is ``2h - z s_fresh`` from the
other).  z solves ``B(z) = delta`` with ``delta = (1 - c) / (S N)``: a union bound over the S
statistics and over the N candidates the released model was chosen among (``N = 1`` when no
choice read the validation rows: ``selection=average``, ``last``, ``random``; the number of
evaluated checkpoints under ``best_feasible``, whose choice reads them), so that the released
model meets every constraint on fresh data with probability >= c, whichever was chosen.

What is printed.  ``confidence c`` when the certificate holds; otherwise the certified bound: the
smallest ``t`` such that the rule holds at every ``gamma_j + t`` (``gamma + t`` is what the
released model can be certified for), and the confidence the certificate gives at gamma itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from raco_cli.constraints.margin import row_ranges, statistics
from raco_cli.constraints.rate import ConstraintSet

# the shared protocol's split (raco_cli.data.tabular): test 25 % of the rows, validation 15 % of
# the rest, so a fresh sample of the test split's size is test / val = 0.25 / (0.75 * 0.15) times
# the validation split
FRESH_PER_VAL = 0.25 / (0.75 * 0.15)
_NORMAL = NormalDist()


@dataclass(frozen=True)
class Certificate:
    """What the certificate found for a released model (module docstring).

    Attributes:
        confidence: the confidence asked for (``constraint.confidence``).
        holds: whether the rule holds at the constraints' gammas at that confidence.
        achieved: the largest confidence at which it holds at those gammas (0: none).
        slack: the smallest t at which it holds at every ``gamma_j + t`` (<= 0 when it holds).
        estimate: (J,) the rates ``G_j`` read from the (noisy) validation counts.
        sd: (J,) ``s_j``.
        candidates: N of the union bound.
        count_sd: sigma_Z of each released count (0: exact counts).
    """

    confidence: float
    holds: bool
    achieved: float
    slack: float
    estimate: np.ndarray
    sd: np.ndarray
    candidates: int
    count_sd: float

    def record(self, names: tuple[str, ...]) -> dict:
        """The certificate as summary.json holds it (every value post-processing of the release)."""
        return {"holds": bool(self.holds), "confidence": self.confidence, "achieved": round(float(self.achieved), 6),
                "slack": round(float(self.slack), 6), "candidates": int(self.candidates), "count_sd": float(self.count_sd),
                "estimate": {n: round(float(g), 6) for n, g in zip(names, self.estimate)},
                "sd": {n: round(float(s), 6) for n, s in zip(names, self.sd)}}


def prediction_counts(cons: ConstraintSet, y: np.ndarray, group: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """``c_{q,k}`` (Q, K) int64: rows of cell q predicted as class k (the release's input).

    >>> from raco_cli.constraints.families import demographic_parity
    >>> cons = ConstraintSet.build(demographic_parity(n_classes=2, n_groups=2, gamma=0.05), n_classes=2, n_groups=2)
    >>> prediction_counts(cons, np.array([0, 1, 1]), np.array([0, 0, 1]), np.array([1, 1, 0])).tolist()
    [[0, 2], [1, 0]]
    """
    cells = cons.cells(np.asarray(y), np.asarray(group))
    flat = cells.astype(np.int64) * cons.K + np.asarray(pred, dtype=np.int64)
    return np.bincount(flat, minlength=cons.Q * cons.K).reshape(cons.Q, cons.K).astype(np.int64)


def _rates_and_sd(cons: ConstraintSet, counts: np.ndarray, count_sd: float, fresh_per_val: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(G (J,), s (J,), s_fresh (J,)) of the module docstring."""
    c = np.maximum(np.asarray(counts, dtype=np.float64), 0.0)  # a noisy count below 0: clipped (post-processing)
    K = cons.K
    n = c.sum(axis=1)  # (Q,) released cell sizes
    low = np.maximum(n - 2.0 * count_sd * np.sqrt(K), 1.0)  # two sds of the sum of K noisy counts lower
    estimate = cons.gamma_post(c, floor=1.0)
    if K == 2:  # the variance of a 0/1 prediction at the cell's rate, moved towards 1/2 by its noise
        p = c[:, 1] / np.maximum(n, 1.0)
        reach = 2.0 * count_sd * np.sqrt(2.0) / low
        p_star = np.clip(0.5, p - reach, p + reach)
        v = np.clip(p_star * (1.0 - p_star), 0.0, 0.25)
    else:
        v = np.full(cons.Q, 0.25)
    r2 = row_ranges(cons, low) ** 2  # (J, Q)
    s_val2 = (r2 * v[None, :] / low[None, :]).sum(axis=1)
    s_fresh2 = s_val2 / fresh_per_val
    s_noise2 = np.zeros(cons.J)
    if count_sd > 0:
        N = cons.membership @ low  # (M,) lowered subset sizes
        P = cons.rates(c, floor=1.0)  # (M, K)
        centred = cons.alpha - (cons.alpha * P[None, :, :]).sum(axis=2, keepdims=True)  # (J, M, K)
        grad = np.einsum("jmk,mq->jqk", centred / N[None, :, None], cons.membership)  # dGamma_j / dc_{q,k}
        s_noise2 = count_sd**2 * (grad**2).sum(axis=(1, 2))
    return estimate, np.sqrt(s_val2 + s_fresh2 + s_noise2), np.sqrt(s_fresh2)


def risk_bound(z: float, half_width: float | None, fresh_sd: float) -> float:
    """``B(z)`` of the module docstring: the chance a certified statistic fails on fresh data.

    >>> round(risk_bound(1.2816, None, 0.01), 4), round(risk_bound(1.2816, 0.05, 0.01), 4)
    (0.1, 0.1)
    >>> round(risk_bound(1.0, 0.001, 0.01), 4)  # a narrow interval: both sides
    0.3173
    """
    one = _NORMAL.cdf(-z)
    if half_width is None:
        return one
    other = _NORMAL.cdf(-(2.0 * half_width / max(fresh_sd, 1e-300) - z))
    return one + min(one, other)


def z_for(delta: float, half_width: float | None, fresh_sd: float) -> float:
    """The smallest z with ``B(z) <= delta`` (B falls in z): the one-sided quantile when the far
    side adds nothing at it, else by bisection above it.

    >>> round(z_for(0.1, None, 0.01), 4), round(z_for(0.1, 0.05, 0.01), 4), round(z_for(0.1, 0.001, 0.01), 4)
    (1.2816, 1.2816, 1.6449)
    """
    z = _NORMAL.inv_cdf(1.0 - min(max(delta, 1e-300), 0.5))
    if risk_bound(z, half_width, fresh_sd) <= delta:
        return z
    lo, hi = z, z + 40.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if risk_bound(mid, half_width, fresh_sd) > delta else (lo, mid)
    return hi


def certify(cons: ConstraintSet, counts: np.ndarray, *, confidence: float, count_sd: float, candidates: int = 1,
            fresh_per_val: float = FRESH_PER_VAL) -> Certificate:
    """The certificate of a model from its validation prediction counts (module docstring).

    ``cons``: the constraints at the gammas the user asked for; ``counts`` (Q, K): the released
    (or exact) counts; ``count_sd``: sigma_Z of each count (0: exact).

    >>> from raco_cli.constraints.families import demographic_parity
    >>> cons = ConstraintSet.build(demographic_parity(n_classes=2, n_groups=2, gamma=0.05), n_classes=2, n_groups=2)
    >>> fair = certify(cons, np.array([[4000, 1000], [8000, 2000]]), confidence=0.9, count_sd=0.0)
    >>> fair.holds, round(fair.achieved, 3)
    (True, 1.0)
    >>> unfair = certify(cons, np.array([[4000, 1000], [7000, 3000]]), confidence=0.9, count_sd=0.0)
    >>> unfair.holds, round(unfair.slack, 3) > 0.05
    (False, True)
    """
    estimate, sd, fresh = _rates_and_sd(cons, counts, count_sd, fresh_per_val)
    found = statistics(cons)
    n_candidates = max(int(candidates), 1)
    gamma = np.asarray(cons.gamma, dtype=np.float64)

    def sides(t: float) -> list[tuple[float, float, float, float | None]]:
        """Per statistic: (distance of G to its nearest bound in sds, s, s_fresh, half-width) at gamma + t."""
        out = []
        for stat in found:
            idx = list(stat.members)
            s = float(sd[idx].max())
            f = float(fresh[idx].max())
            room = min(float((gamma[j] + t) - estimate[j]) for j in idx)  # every member's slack, the least
            half = None if stat.half_width is None else stat.half_width + t
            out.append((room / max(s, 1e-300), s, f, half))
        return out

    def holds_at(t: float, c: float) -> bool:
        delta = (1.0 - c) / (max(len(found), 1) * n_candidates)
        return all(z_room >= z_for(delta, half, f) for z_room, _s, f, half in sides(t))

    ok = holds_at(0.0, confidence)
    # the largest c at which every statistic holds: B at each one's room, the worst, times S N
    # (none when an estimate is past its gamma: the rule never certifies that, at any confidence)
    at_gamma = sides(0.0)
    worst = max((risk_bound(z_room, half, f) for z_room, _s, f, half in at_gamma), default=0.0)
    past = any(z_room < 0 for z_room, _s, _f, _h in at_gamma)
    achieved = 0.0 if past else float(min(max(1.0 - max(len(found), 1) * n_candidates * worst, 0.0), 1.0))
    lo, hi = -1.0, 2.0  # t: the rule fails at lo (gamma - 1 < every rate) and holds at hi unless s is huge
    if not holds_at(hi, confidence):
        slack = float("inf")
    else:
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if holds_at(mid, confidence) else (mid, hi)
        slack = hi
    return Certificate(confidence=float(confidence), holds=bool(ok), achieved=achieved, slack=float(slack),
                       estimate=estimate, sd=sd, candidates=n_candidates, count_sd=float(count_sd))
