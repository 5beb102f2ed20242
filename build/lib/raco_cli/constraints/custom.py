"""User-written rate constraints (``constraint=custom``): YAML -> :class:`RateConstraint`.

A custom constraint is paper eq. (6) written term by term,
``Gamma_j = sum_terms alpha * P_k(D_S) <= gamma_j``, where each term names

* ``alpha``: its weight (a finite, non-zero number; default 1),
* ``predicted``: the predicted class k (name or index),
* the rows ``D_S`` as label/group selections: ``label`` and ``group`` (a name, an index or a
  list of them; default: all) and ``label_not`` / ``group_not`` (excluded values).

For example "the positive rate of group A is at least 0.8 of group B's" is
``0.8 * P_1(D[Z=B]) - P_1(D[Z=A]) <= 0``::

    constraints:
      - name: four_fifths
        gamma: 0.0
        terms:
          - {alpha: 0.8, predicted: 1, group: B}
          - {alpha: -1.0, predicted: 1, group: A}

The user never writes the global partition: :meth:`ConstraintSet.build` derives the smallest
one that serves every subset (paper Remark 1) - by group here, by label, or by both.
Unlike the built-in families, a custom ``gamma`` may be negative (``-P_1(S) <= -0.8`` is
"the rate is at least 0.8").

:func:`check` validates the structure without the data (the CLI runs it before anything
starts); :func:`constraints` also resolves label and group names against the data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from raco_cli.constraints.families import resolve_class, resolve_group
from raco_cli.constraints.rate import RateConstraint, RateTerm
from raco_cli.errors import ConfigError

CONSTRAINT_KEYS = ("gamma", "name", "terms")
TERM_KEYS = ("alpha", "group", "group_not", "label", "label_not", "predicted")
_HINT = "see conf/constraint/custom.yaml"


def check(raw: object, *, key: str) -> None:
    """Validate the structure of ``constraints`` (types, keys, alpha, empty lists).

    Raises:
        ConfigError: the first problem, as one line naming its key.
    """
    _walk(raw, key=key, gamma=0.0, class_names=None, group_names=None)


def constraints(
    raw: object, *, key: str, gamma: float, class_names: Sequence[str], group_names: Sequence[str]
) -> list[RateConstraint]:
    """The rate constraints of a ``constraints`` list, names resolved against the data.

    Args:
        raw: the list of constraint mappings (plain Python, from the config).
        key: config path of the list, for messages (``constraint.constraints``).
        gamma: default gamma of the constraints that do not set their own.
        class_names: names of the labels (indices are accepted too).
        group_names: names of the sensitive groups.

    Raises:
        ConfigError: unknown label/group names or indices, empty subsets, bad alpha, ...
    """
    out = _walk(raw, key=key, gamma=gamma, class_names=class_names, group_names=group_names)
    assert out is not None
    return out


def _walk(
    raw: object,
    *,
    key: str,
    gamma: float,
    class_names: Sequence[str] | None,
    group_names: Sequence[str] | None,
) -> list[RateConstraint] | None:
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)) or not raw:
        raise ConfigError(f"{key} must be a non-empty list of rate constraints (got {key}={raw!r}); {_HINT}.")
    resolve = class_names is not None and group_names is not None
    out: list[RateConstraint] = []
    seen: set[str] = set()
    for j, c in enumerate(raw):
        ckey = f"{key}[{j}]"
        if not isinstance(c, Mapping):
            raise ConfigError(f"{ckey} must be a mapping with keys {', '.join(CONSTRAINT_KEYS)} (got {c!r}); {_HINT}.")
        _known_keys(c, CONSTRAINT_KEYS, ckey)
        name = c.get("name")
        if name is None:
            name = f"custom[{j}]"
        elif not isinstance(name, str) or not name:
            raise ConfigError(f"{ckey}.name must be a non-empty string (got {name!r}).")
        if name in seen:
            raise ConfigError(f"{ckey}.name '{name}' is used twice; constraint names must be unique.")
        seen.add(name)
        g = c.get("gamma", None)
        if g is None:
            g = gamma
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g):
            raise ConfigError(f"{ckey}.gamma must be a finite number (got {g!r}); it is the right-hand side of the constraint.")
        terms = c.get("terms")
        if not isinstance(terms, Sequence) or isinstance(terms, (str, bytes)) or not terms:
            raise ConfigError(f"{ckey}.terms must be a non-empty list of terms {{alpha, predicted, label, group}} (got {terms!r}); {_HINT}.")
        parsed = [_term(t, key=f"{ckey}.terms[{i}]", class_names=class_names, group_names=group_names) for i, t in enumerate(terms)]
        if resolve:
            out.append(RateConstraint(name=name, terms=tuple(parsed), gamma=float(g), family="custom"))  # type: ignore[arg-type]
    return out if resolve else None


def _known_keys(m: Mapping[str, Any], allowed: Sequence[str], key: str) -> None:
    for k in m:
        if k not in allowed:
            raise ConfigError(f"Unknown key {key}.{k}. Allowed: {', '.join(allowed)}.")


def _values(value: object, *, key: str) -> list[object]:
    """A scalar or a list of scalars -> a list (an empty list is an error)."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        values = list(value)
        if not values:
            raise ConfigError(f"{key} is an empty list, so the term selects no rows; omit the key to select every value.")
        return values
    return [value]


def _term(
    t: object, *, key: str, class_names: Sequence[str] | None, group_names: Sequence[str] | None
) -> RateTerm | None:
    if not isinstance(t, Mapping):
        raise ConfigError(f"{key} must be a mapping with keys {', '.join(TERM_KEYS)} (got {t!r}); {_HINT}.")
    _known_keys(t, TERM_KEYS, key)
    alpha = t.get("alpha", 1.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha == 0:
        raise ConfigError(f"{key}.alpha must be a finite non-zero number (got {key}.alpha={alpha!r}); it weighs the rate of this term.")
    if "predicted" not in t:
        raise ConfigError(f"{key}.predicted is missing; name the predicted class k whose rate P_k the term takes.")
    selections = {}
    for sel in ("label", "group", "label_not", "group_not"):
        if sel in t:
            values = _values(t[sel], key=f"{key}.{sel}")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, (int, str)):
                    raise ConfigError(f"{key}.{sel} must be a name or an index, or a list of them (got {v!r}).")
            selections[sel] = values
    p = t["predicted"]
    if isinstance(p, bool) or not isinstance(p, (int, str)):
        raise ConfigError(f"{key}.predicted must be a class name or index (got {p!r}).")
    if class_names is None or group_names is None:
        return None
    k = resolve_class(p, key=f"{key}.predicted", class_names=class_names)
    labels = _select(selections, "label", f"{key}", lambda v, kk: resolve_class(v, key=kk, class_names=class_names), len(class_names))
    groups = _select(selections, "group", f"{key}", lambda v, kk: resolve_group(v, key=kk, group_names=group_names), len(group_names))
    if not labels or not groups:
        empty = "label" if not labels else "group"
        raise ConfigError(
            f"{key} selects no rows: every {empty} is excluded by {key}.{empty}_not; "
            f"a term's rows are (label in {sorted(labels)}) x (group in {sorted(groups)})."
        )
    return RateTerm(frozenset((y, z) for y in labels for z in groups), k, float(alpha))


def _select(selections: Mapping[str, list[object]], what: str, key: str, resolve: Any, n: int) -> set[int]:
    chosen = (
        {resolve(v, f"{key}.{what}") for v in selections[what]} if what in selections else set(range(n))
    )
    excluded = {resolve(v, f"{key}.{what}_not") for v in selections.get(f"{what}_not", [])}
    return chosen - excluded
