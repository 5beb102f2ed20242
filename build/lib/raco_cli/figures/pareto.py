"""Pareto fronts and seed aggregation: pure functions (no I/O, no plotting).

A trade-off point is (constraint value x, utility y): lower x is fairer (a smaller gap, a
smaller FNR), higher y is better (accuracy).  Point ``j`` *dominates* ``i`` when
``x_j <= x_i`` and ``y_j >= y_i`` with at least one strict inequality.  The Pareto front is
the set of points no other point dominates; identical points do not dominate each other, so
duplicates on the front are all kept.  Points with a NaN coordinate are not comparable and
never on the front.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def dominates(a: tuple[float, float], b: tuple[float, float], *, minimize_x: bool = True, maximize_y: bool = True) -> bool:
    """Whether point ``a`` dominates ``b`` (see the module docstring).

    >>> dominates((0.01, 0.85), (0.02, 0.84))
    True
    >>> dominates((0.01, 0.85), (0.01, 0.85))
    False
    """
    ax, ay = (a[0] if minimize_x else -a[0]), (a[1] if maximize_y else -a[1])
    bx, by = (b[0] if minimize_x else -b[0]), (b[1] if maximize_y else -b[1])
    return ax <= bx and ay >= by and (ax < bx or ay > by)


def pareto_front(
    xs: Sequence[float], ys: Sequence[float], *, minimize_x: bool = True, maximize_y: bool = True
) -> list[int]:
    """Indices of the non-dominated points, ordered by x (best first), then input order.

    Sort by x (then by y, best first) and sweep: a point is on the front when its y beats
    the best y of every point with a strictly better x, and equals the best y among points
    with the same x.  O(n log n).

    >>> pareto_front([0.05, 0.02, 0.10, 0.02], [0.84, 0.80, 0.83, 0.81])
    [3, 0]
    """
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys differ in length ({len(xs)} != {len(ys)})")
    sx = [float(x) if minimize_x else -float(x) for x in xs]
    sy = [float(y) if maximize_y else -float(y) for y in ys]
    idx = [i for i in range(len(sx)) if not (math.isnan(sx[i]) or math.isnan(sy[i]))]
    idx.sort(key=lambda i: (sx[i], -sy[i], i))
    front: list[int] = []
    best_before = -math.inf  # best y among points with a strictly smaller x
    k = 0
    while k < len(idx):
        j = k
        while j < len(idx) and sx[idx[j]] == sx[idx[k]]:
            j += 1
        group = idx[k:j]  # same x, sorted by y descending
        top = sy[group[0]]
        if top > best_before:
            front.extend(i for i in group if sy[i] == top)
        best_before = max(best_before, top)
        k = j
    return front


# two-sided 95 % Student-t quantiles for n - 1 degrees of freedom (avoids a scipy import)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
        18: 2.101, 19: 2.093, 20: 2.086, 24: 2.064, 29: 2.045, 39: 2.023, 59: 2.001, 119: 1.980}  # fmt: skip


def t95(dof: int) -> float:
    """Two-sided 95 % t quantile (table above; the next smaller tabulated dof, which errs wide;
    beyond the table the Cornish-Fisher expansion around z = 1.96, accurate to 1e-5 there).

    >>> t95(19)
    2.093
    """
    if dof < 1:
        return math.nan
    if dof in _T95:
        return _T95[dof]
    smaller = [d for d in _T95 if d <= dof]
    if dof <= max(_T95):
        return _T95[max(smaller)]
    z = 1.959964
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


@dataclass(frozen=True)
class MeanCI:
    """Mean and the half-width of its 95 % confidence interval (t-based) over n values."""

    mean: float
    ci: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.4f} ± {self.ci:.4f}" if self.n > 1 else f"{self.mean:.4f}"


def mean_ci(values: Sequence[float]) -> MeanCI:
    """Mean ± 95 % CI half-width of the finite values (ci = 0 for one value, NaN for none).

    >>> m = mean_ci([1.0, 2.0, 3.0]); (m.mean, round(m.ci, 3), m.n)
    (2.0, 2.484, 3)
    """
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(vals)
    if n == 0:
        return MeanCI(math.nan, math.nan, 0)
    mean = sum(vals) / n
    if n == 1:
        return MeanCI(mean, 0.0, 1)
    var = sum((v - mean) ** 2 for v in vals) / (n - 1)
    return MeanCI(mean, t95(n - 1) * math.sqrt(var / n), n)
