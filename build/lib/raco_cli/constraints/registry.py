"""Constraint name registry and specs: ``constraint=<name>`` -> a :class:`ConstraintSet`.

A run's constraints are one or more *parts*, each a family (``dp``, ``eo``, ``fnr``, ``fpr``,
``eop``, ``custom``) with its gamma and options.  ``constraint=combo`` (or the shorthand
``constraint=dp+fnr``) lists several parts; :func:`build_parts` concatenates their rate
constraints and :meth:`ConstraintSet.build` derives the common refinement of their
partitions, so one histogram per step serves every constraint of the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raco_cli.constraints import custom, families
from raco_cli.constraints.rate import ConstraintSet, RateConstraint
from raco_cli.errors import GAMMA_RANGE, ConfigError, unknown_name

Builder = Callable[..., list[RateConstraint]]

CONSTRAINTS: dict[str, Builder | None] = {
    "none": None,
    "dp": families.demographic_parity,
    "eo": families.equalized_odds,
    "fnr": families.false_negative_rate,
    "fpr": families.false_positive_rate,
    "eop": families.equal_opportunity,
    "custom": None,  # built from its YAML by raco_cli.constraints.custom
}
COMBO = "combo"
#: every value ``constraint.name`` may take
NAMES = (*CONSTRAINTS, COMBO)

#: family-specific keys allowed next to ``name`` and ``gamma``
OPTIONS: dict[str, tuple[str, ...]] = {
    "none": (),
    "dp": (),
    "eo": (),
    "fnr": ("positive_class",),
    "fpr": ("positive_class",),
    "eop": ("positive_class",),
    "custom": ("constraints",),
}


@dataclass(frozen=True)
class PartSpec:
    """One constraint family of a run.

    Attributes:
        family: registry key (dp, eo, fnr, fpr, eop, custom).
        gamma: allowed gap of each of its constraints (custom: the default right-hand side).
        options: family-specific settings (``positive_class``; custom: ``constraints``).
    """

    family: str
    gamma: float
    options: Mapping[str, Any] = field(default_factory=dict)


def part_spec(family: object, raw: Mapping[str, Any], *, key: str, default_gamma: float | None = None) -> PartSpec:
    """Validate one family's config (without the data) into a :class:`PartSpec`.

    Args:
        family: the family name.
        raw: its config mapping (``name``, ``gamma``, options).
        key: config path of the mapping, for messages (``constraint`` or ``constraint.families.fnr``).
        default_gamma: used when ``raw['gamma']`` is null (parts of a combination).

    Raises:
        ConfigError: unknown family or key, bad gamma, bad option types.
    """
    if family not in CONSTRAINTS:
        raise unknown_name("constraint", family, NAMES)
    assert isinstance(family, str)
    allowed = ("name", "gamma", *OPTIONS[family])
    for k in raw:
        if k not in allowed:
            raise ConfigError(f"Unknown key {key}.{k} for constraint={family}. Allowed: {', '.join(allowed)}.")
    gamma = raw.get("gamma")
    if gamma is None:
        gamma = default_gamma
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)):
        raise ConfigError(
            f"{key}.gamma must be a number (got {key}.gamma={gamma!r}); gamma is the allowed gap of each rate constraint."
        )
    gamma = float(gamma)
    if family == "custom":
        if not math.isfinite(gamma):
            raise ConfigError(f"{key}.gamma must be a finite number (got {gamma}).")
    elif not gamma >= 0 or not math.isfinite(gamma):
        raise ConfigError(GAMMA_RANGE.format(value=gamma))
    options = {k: raw[k] for k in OPTIONS[family] if k in raw}
    if "positive_class" in options:
        pc = options["positive_class"]
        items = pc if isinstance(pc, (list, tuple)) else [pc]
        if pc is not None and (
            not items or any(isinstance(v, bool) or not isinstance(v, (int, str)) for v in items)
        ):
            raise ConfigError(
                f"{key}.positive_class must be null, a class name or index, or a list of them (got {pc!r})."
            )
        if isinstance(pc, tuple):
            options["positive_class"] = list(pc)
    if family == "custom":
        custom.check(raw.get("constraints"), key=f"{key}.constraints")
    return PartSpec(family=family, gamma=gamma, options=options)


def constraints_of(
    part: PartSpec, *, n_classes: int, n_groups: int, class_names: Sequence[str], group_names: Sequence[str], key: str = "constraint"
) -> list[RateConstraint]:
    """The rate constraints of one part, resolved against the data's classes and groups."""
    if part.family == "custom":
        return custom.constraints(
            part.options.get("constraints"), key=f"{key}.constraints", gamma=part.gamma,
            class_names=class_names, group_names=group_names,
        )
    builder = CONSTRAINTS[part.family]
    if builder is None:
        return []
    return builder(
        n_classes=n_classes, n_groups=n_groups, gamma=part.gamma, class_names=class_names, **dict(part.options)
    )


def build_parts(
    parts: Sequence[PartSpec],
    *,
    n_classes: int,
    n_groups: int,
    class_names: Sequence[str] | None = None,
    group_names: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
) -> ConstraintSet:
    """All constraints of the parts over the common refinement of their partitions.

    Raises:
        ConfigError: names the data does not have, empty subsets, duplicate constraint names.
    """
    class_names = tuple(class_names) if class_names is not None else tuple(str(k) for k in range(n_classes))
    group_names = tuple(group_names) if group_names is not None else tuple(str(g) for g in range(n_groups))
    out: list[RateConstraint] = []
    for i, part in enumerate(parts):
        key = keys[i] if keys is not None else "constraint"
        out += constraints_of(
            part, n_classes=n_classes, n_groups=n_groups, class_names=class_names, group_names=group_names, key=key
        )
    names = [c.name for c in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"Constraint names must be unique across the parts of a run (repeated: {', '.join(dup)}).")
    return ConstraintSet.build(out, n_classes=n_classes, n_groups=n_groups)


def build(
    name: str,
    *,
    n_classes: int,
    n_groups: int,
    gamma: float,
    options: Mapping[str, Any] | None = None,
    class_names: Sequence[str] | None = None,
    group_names: Sequence[str] | None = None,
) -> ConstraintSet:
    """Build one named constraint family for data with the given classes and groups.

    Raises:
        ConfigError: unknown name, gamma < 0, or cells the data does not have.
    """
    if name not in CONSTRAINTS:
        raise unknown_name("constraint", name, CONSTRAINTS)
    parts = [] if name == "none" else [part_spec(name, {"gamma": gamma, **dict(options or {})}, key="constraint")]
    return build_parts(parts, n_classes=n_classes, n_groups=n_groups, class_names=class_names, group_names=group_names)


def parse_parts(value: object, *, key: str) -> list[str]:
    """The family names of a combination: ``"dp+fnr"`` or ``[dp, fnr]`` -> ``["dp", "fnr"]``.

    ``none`` entries are dropped (``constraint.parts=none`` is an unconstrained run).

    Raises:
        ConfigError: not a string or list, an unknown or repeated family, ``combo`` inside.
    """
    if isinstance(value, str):
        names = [v.strip() for v in value.split("+")]
    elif isinstance(value, Sequence) and not isinstance(value, bytes):
        names = [v.strip() if isinstance(v, str) else v for v in value]
    else:
        raise ConfigError(f"{key} must be a '+'-separated string or a list of constraint families (got {key}={value!r}), e.g. dp+fnr.")
    families_ = [n for n in names if n != "none"]
    for n in families_:
        if n not in CONSTRAINTS:
            raise unknown_name("constraint", n, [c for c in CONSTRAINTS if c != "none"])
    if len(set(families_)) != len(families_):
        raise ConfigError(f"{key} lists a family twice (got {key}={value!r}); each family appears once.")
    return families_
