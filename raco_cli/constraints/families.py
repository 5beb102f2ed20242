"""Standard rate-constraint families (paper Appendix A, Table 1), written over fine cells.

Each builder returns the list of :class:`RateConstraint` of one family; a run may combine
several families, and :meth:`ConstraintSet.build` derives the smallest global partition
that serves them all.
"""

from __future__ import annotations

from raco_cli.constraints.rate import RateConstraint, RateTerm, complement


def _fine(n_classes: int, n_groups: int) -> list[tuple[int, int]]:
    return [(y, z) for y in range(n_classes) for z in range(n_groups)]


def demographic_parity(*, n_classes: int, n_groups: int, gamma: float) -> list[RateConstraint]:
    """Demographic parity, one-vs-rest form (paper eq. 7 / 13).

    ``P_k(D[Z=z]) - P_k(D[Z!=z]) <= gamma`` for every group z and predicted class k:
    ``J = |Z| * |Y|`` constraints over the partition by group (``Q = |Z|``).
    """
    universe = _fine(n_classes, n_groups)
    out = []
    for z in range(n_groups):
        inside = frozenset((y, z) for y in range(n_classes))
        outside = complement(inside, universe)
        for k in range(n_classes):
            out.append(
                RateConstraint(
                    name=f"dp[group={z},class={k}]",
                    terms=(RateTerm(inside, k, 1.0), RateTerm(outside, k, -1.0)),
                    gamma=gamma,
                    family="dp",
                )
            )
    return out
