"""Statistics of empirical privacy audits: epsilon lower bounds from guesses.

* :func:`one_run_p_value` / :func:`eps_lower_bound_one_run`: the one-training-run audit of
  Steinke, Nasr and Jagielski (NeurIPS 2023, arXiv:2305.08846, Theorem 3.1 for pure DP and
  the (eps, delta) p-value of their appendix code ``p_value_DP_audit``).  With m canaries
  included independently with probability 1/2, r guesses (a number fixed in advance) of
  which v are correct, the p-value of "the mechanism is (eps, delta)-DP" is::

      p(eps, delta) = P[Bin(r, q_eps) >= v] + 2 m delta * max_{i=1..v} P[v-i <= Bin(r, q_eps) < v] / i

  with ``q_eps = e^eps / (1 + e^eps)``; the lower bound is the largest eps rejected at
  level beta.  With probability >= 1 - beta it does not exceed the true epsilon of any
  (eps, delta)-DP mechanism.
* :func:`eps_lower_bound_clopper_pearson`: the classic multi-run audit (Jagielski et al.
  2020, Nasr et al. 2021): false-positive / false-negative rates of a distinguisher over
  runs with and without the canary, each bounded by a one-sided Clopper-Pearson interval at
  level beta/2, then ``eps >= ln((1 - delta - FNR) / FPR)`` (and the symmetric bound).

No torch, no Hydra: pure functions of counts, checked against the reference values of the
research note (``/work/notes/audit.md``) and the authors' code in the tests.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special, stats


def one_run_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """p-value of ``(eps, delta)``-DP given v correct out of r guesses on m canaries.

    >>> round(one_run_p_value(100, 100, 100, 0.0, 0.0), 30) == round(0.5 ** 100, 30)
    True
    """
    if v <= 0 or r <= 0:
        return 1.0
    q = float(special.expit(eps))
    beta = float(stats.binom.sf(v - 1, r, q))  # P[Bin(r, q) >= v]
    if delta == 0:
        return min(beta, 1.0)
    i = np.arange(1, v + 1)
    alpha = float(np.max((stats.binom.sf(v - i - 1, r, q) - beta) / i))  # P[v-i <= Bin < v] / i
    return min(beta + 2.0 * m * delta * alpha, 1.0)


def eps_lower_bound_one_run(m: int, r: int, v: int, *, delta: float, beta: float) -> float:
    """Largest eps whose one-run p-value is <= beta (0 when even eps = 0 is not rejected).

    The p-value decreases in eps, so the bound is found by bracketing and brentq.
    Reference values (research note, checked against the authors' bisection):
    m = r = v = 1000, delta = 1e-5, beta = 0.05 gives 5.78; m = r = v = 100 gives 3.49.

    >>> round(eps_lower_bound_one_run(1000, 1000, 1000, delta=1e-5, beta=0.05), 2)
    5.78
    """
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    if r <= 0 or v <= 0 or one_run_p_value(m, r, v, 0.0, delta) > beta:
        return 0.0
    hi = 1.0
    while one_run_p_value(m, r, v, hi, delta) <= beta:
        hi *= 2.0
        if hi > 1e3:  # v correct out of r cannot certify more (delta term dominates first)
            return hi
    return float(optimize.brentq(lambda e: one_run_p_value(m, r, v, e, delta) - beta, 0.0, hi, xtol=1e-6))


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided upper (1 - alpha) Clopper-Pearson bound of a binomial rate, k of n.

    >>> round(clopper_pearson_upper(0, 100, 0.025), 4)
    0.0362
    """
    if n <= 0 or k >= n:
        return 1.0
    return float(stats.beta.ppf(1.0 - alpha, k + 1, n - k))


def eps_lower_bound_clopper_pearson(fp: int, n0: int, fn: int, n1: int, *, delta: float, beta: float) -> float:
    """eps lower bound of a distinguisher with ``fp`` false positives in n0 runs without the
    canary and ``fn`` false negatives in n1 runs with it (joint confidence 1 - beta).

    Research note's table (perfect distinguisher, delta = 1e-5, beta = 0.05): 100 runs per
    side give 3.28.

    >>> round(eps_lower_bound_clopper_pearson(0, 100, 0, 100, delta=1e-5, beta=0.05), 2)
    3.28
    """
    u0 = clopper_pearson_upper(fp, n0, beta / 2)
    u1 = clopper_pearson_upper(fn, n1, beta / 2)
    candidates = [0.0]
    for a, b in ((u1, u0), (u0, u1)):
        if 1.0 - delta - a > 0 and b > 0:
            candidates.append(math.log((1.0 - delta - a) / b))
    return max(candidates)


def top_k_guesses(scores: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of the k largest scores; ties broken by independent randomness.

    Ties matter: without noise, every excluded canary and every never-sampled included one
    score exactly 0, and a deterministic order would correlate guesses with the index.
    """
    scores = np.asarray(scores, dtype=np.float64)
    jitter = rng.random(len(scores))
    order = np.lexsort((jitter, -scores))  # primary key: score descending
    return order[: max(0, int(k))]
