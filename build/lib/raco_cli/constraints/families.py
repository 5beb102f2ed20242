"""Standard rate-constraint families (paper Appendix A, Table 1), written over fine cells.

Each builder returns the list of :class:`RateConstraint` of one family; a run may combine
several families, and :meth:`ConstraintSet.build` derives the smallest global partition
that serves them all (paper Remark 1).  Builders work for any number of classes ``K = |Y|``
and groups ``|Z|``; notation: ``P_k(S)`` is the rate of predicted class k on the rows S,
``D[Y=y, Z=z]`` the rows with label y and group z.

=========  ==========================================================  ==================  ===============
family     constraint (each ``<= gamma``)                               J                   partition
=========  ==========================================================  ==================  ===============
dp         ``P_k(D[Z=z]) - P_k(D[Z!=z])``  for all z, k (eq. 13)          ``|Z| |Y|``         group
eo         ``P_k(D[Y=y,Z=z]) - P_k(D[Y=y,Z!=z])`` for all y, z, k        ``|Y|^2 |Z|``       (label, group)
           (eq. 16, counterfactual one-vs-rest)
fnr        ``P_k(D[Y!=k])`` for all k (eq. 17); with ``positive_class``  ``|Y|`` (or 1)      label
           c: ``sum_{k!=c} P_k(D[Y=c]) = 1 - recall_c``
fpr        ``P_c(D[Y!=c])`` for each positive class c                     ``|C|``             label
eop        ``+-(P_c(D[Y=c,Z=z]) - P_c(D[Y=c,Z!=z]))`` for all z, c       ``2 |Z| |C|``       (label=c, group)
=========  ==========================================================  ==================  ===============

For binary tasks (positive class 1) the rows of eq. 17 are: k=0, ``P_0(D[Y=1])`` = the
false-negative rate; k=1, ``P_1(D[Y=0])`` = the false-positive rate (= the FNR of class 0
when 0 is taken as positive).  So ``fnr`` as in the paper bounds both FNR and FPR;
``positive_class: 1`` keeps the FNR alone.  For K > 2, row k of eq. 17 is the one-vs-rest
false-positive rate of class k.
"""

from __future__ import annotations

from collections.abc import Sequence

from raco_cli.constraints.rate import RateConstraint, RateTerm, complement
from raco_cli.errors import ConfigError

ClassSelection = int | str | Sequence[int | str] | None


def _fine(n_classes: int, n_groups: int) -> list[tuple[int, int]]:
    return [(y, z) for y in range(n_classes) for z in range(n_groups)]


def _needs_groups(family: str, n_groups: int) -> None:
    if n_groups < 2:
        raise ConfigError(
            f"constraint={family} compares sensitive groups, but the data has {n_groups} group; "
            "use a dataset with at least 2 groups or a label-only constraint (fnr, fpr)."
        )


def resolve_class(value: object, *, key: str, class_names: Sequence[str]) -> int:
    """A class given by index or name -> its index.

    Raises:
        ConfigError: unknown name, index out of range, or a non-scalar value.
    """
    return _resolve(value, key=key, names=class_names, kind="class")


def resolve_group(value: object, *, key: str, group_names: Sequence[str]) -> int:
    """A sensitive group given by index or name -> its index."""
    return _resolve(value, key=key, names=group_names, kind="group")


def _resolve(value: object, *, key: str, names: Sequence[str], kind: str) -> int:
    n = len(names)
    allowed = f"{', '.join(map(str, names))} (or indices 0..{n - 1})"
    if isinstance(value, str) and value in names:
        return list(names).index(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{key} must be a {kind} name or index (got {key}={value!r}). Available: {allowed}.")
    if isinstance(value, str):
        if not value.lstrip("-").isdigit():
            raise ConfigError(f"Unknown {kind} '{value}' in {key}. Available: {allowed}.")
        value = int(value)
    if not 0 <= value < n:
        raise ConfigError(f"{key}={value} is out of range: the data has {kind} indices 0..{n - 1} ({allowed}).")
    return value


def _classes(positive_class: ClassSelection, *, key: str, class_names: Sequence[str]) -> list[int]:
    """``None`` -> every class; a value or a list -> the resolved indices (sorted, unique)."""
    if positive_class is None:
        return list(range(len(class_names)))
    values = list(positive_class) if isinstance(positive_class, (list, tuple)) else [positive_class]
    if not values:
        raise ConfigError(f"{key} must name at least one class (got an empty list); null selects every class.")
    picked = sorted({resolve_class(v, key=key, class_names=class_names) for v in values})
    if len(class_names) > 2:  # an index picks "the second class" silently when the classes have names
        for v in values:
            if not isinstance(v, bool) and isinstance(v, int) and str(class_names[v]) != str(v):
                raise ConfigError(f"{key}={v} picks the class {class_names[v]!r} of {len(class_names)} ({', '.join(map(str, class_names))}) "
                                  f"by its index; name the class you mean ({key}=<name>, a list, or null for every class).")
    return picked


def _default_names(n: int, prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(n))


def demographic_parity(*, n_classes: int, n_groups: int, gamma: float, **_: object) -> list[RateConstraint]:
    """Demographic parity, one-vs-rest form (paper eq. 7 / 13).

    ``P_k(D[Z=z]) - P_k(D[Z!=z]) <= gamma`` for every group z and predicted class k:
    ``J = |Z| * |Y|`` constraints over the partition by group (``Q = |Z|``).
    """
    _needs_groups("dp", n_groups)
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


def equalized_odds(*, n_classes: int, n_groups: int, gamma: float, **_: object) -> list[RateConstraint]:
    """Equalized odds, counterfactual one-vs-rest form (paper eq. 15/16, Table 1).

    ``P_k(D[Y=y, Z=z]) - P_k(D[Y=y, Z!=z]) <= gamma`` for every true label y, group z and
    predicted class k: ``J = |Y|^2 * |Z|`` constraints over the partition by (label, group)
    (``Q = |Y| * |Z|``).  With two groups, ``max_j Gamma_j`` of hard predictions is
    fairlearn's ``equalized_odds_difference`` (max of the TPR and FPR gaps).
    """
    _needs_groups("eo", n_groups)
    out = []
    for y in range(n_classes):
        for z in range(n_groups):
            inside = frozenset({(y, z)})
            outside = frozenset((y, g) for g in range(n_groups) if g != z)
            for k in range(n_classes):
                out.append(
                    RateConstraint(
                        name=f"eo[label={y},group={z},class={k}]",
                        terms=(RateTerm(inside, k, 1.0), RateTerm(outside, k, -1.0)),
                        gamma=gamma,
                        family="eo",
                    )
                )
    return out


def false_negative_rate(
    *,
    n_classes: int,
    n_groups: int,
    gamma: float,
    positive_class: ClassSelection = None,
    class_names: Sequence[str] | None = None,
    **_: object,
) -> list[RateConstraint]:
    """False-negative-rate bound (paper eq. 17, Table 1).

    ``positive_class=None`` (the paper): ``P_k(D[Y!=k]) <= gamma`` for every class k,
    ``J = |Y|`` over the partition by label.  For binary tasks k=0 is the FNR (positive
    class 1) and k=1 the FPR.

    ``positive_class=c`` (or a list): ``FNR_c = 1 - recall_c = sum_{k!=c} P_k(D[Y=c]) <= gamma``
    for each listed c (for binary tasks and c=1 this is the k=0 row of eq. 17 alone);
    ``J = |C|``.
    """
    names = tuple(class_names) if class_names is not None else _default_names(n_classes, "")
    universe = _fine(n_classes, n_groups)
    if positive_class is None:
        out = []
        for k in range(n_classes):
            others = frozenset((y, z) for y, z in universe if y != k)
            out.append(RateConstraint(name=f"fnr[class={k}]", terms=(RateTerm(others, k, 1.0),), gamma=gamma, family="fnr"))
        return out
    out = []
    for c in _classes(positive_class, key="constraint.positive_class", class_names=names):
        rows = frozenset((c, z) for z in range(n_groups))
        terms = tuple(RateTerm(rows, k, 1.0) for k in range(n_classes) if k != c)
        out.append(RateConstraint(name=f"fnr[positive={c}]", terms=terms, gamma=gamma, family="fnr"))
    return out


def false_positive_rate(
    *,
    n_classes: int,
    n_groups: int,
    gamma: float,
    positive_class: ClassSelection = 1,
    class_names: Sequence[str] | None = None,
    **_: object,
) -> list[RateConstraint]:
    """False-positive-rate bound: ``FPR_c = P_c(D[Y!=c]) <= gamma`` for each positive class c.

    Default ``positive_class=1`` (binary tasks: fairlearn's ``false_positive_rate``), ``J = 1``;
    ``None`` takes every class (``J = |Y|``, then identical to the paper's eq. 17).
    Partition by label.
    """
    names = tuple(class_names) if class_names is not None else _default_names(n_classes, "")
    universe = _fine(n_classes, n_groups)
    out = []
    for c in _classes(positive_class, key="constraint.positive_class", class_names=names):
        negatives = frozenset((y, z) for y, z in universe if y != c)
        out.append(RateConstraint(name=f"fpr[positive={c}]", terms=(RateTerm(negatives, c, 1.0),), gamma=gamma, family="fpr"))
    return out


def equal_opportunity(
    *,
    n_classes: int,
    n_groups: int,
    gamma: float,
    positive_class: ClassSelection = 1,
    class_names: Sequence[str] | None = None,
    **_: object,
) -> list[RateConstraint]:
    """Equal opportunity (Hardt et al. 2016): true-positive-rate parity across groups.

    For each positive class c and group z, both signs of
    ``P_c(D[Y=c, Z=z]) - P_c(D[Y=c, Z!=z]) <= gamma``: ``J = 2 |Z| |C|`` over the partition
    by (label=c, group) plus one cell for the other labels.  For binary tasks (c=1) this is
    eq. 16 restricted to ``y = 1`` (the ``-`` sign is the k=0 row); with two groups,
    ``max_j Gamma_j`` is the TPR gap (fairlearn's ``equal_opportunity_difference``).
    """
    _needs_groups("eop", n_groups)
    names = tuple(class_names) if class_names is not None else _default_names(n_classes, "")
    out = []
    for c in _classes(positive_class, key="constraint.positive_class", class_names=names):
        for z in range(n_groups):
            inside = frozenset({(c, z)})
            outside = frozenset((c, g) for g in range(n_groups) if g != z)
            for sign, label in ((1.0, "+"), (-1.0, "-")):
                out.append(
                    RateConstraint(
                        name=f"eop[positive={c},group={z},sign={label}]",
                        terms=(RateTerm(inside, c, sign), RateTerm(outside, c, -sign)),
                        gamma=gamma,
                        family="eop",
                    )
                )
    return out
