"""Constraint name registry: ``constraint=<name>`` -> a :class:`ConstraintSet` for the data."""

from __future__ import annotations

from collections.abc import Callable

from raco_cli.constraints import families
from raco_cli.constraints.rate import ConstraintSet, RateConstraint
from raco_cli.errors import unknown_name

Builder = Callable[..., list[RateConstraint]]

CONSTRAINTS: dict[str, Builder | None] = {
    "none": None,
    "dp": families.demographic_parity,
}


def build(name: str, *, n_classes: int, n_groups: int, gamma: float) -> ConstraintSet:
    """Build the named constraint family for data with the given classes and groups.

    Raises:
        ConfigError: unknown name, gamma < 0, or cells the data does not have.
    """
    if name not in CONSTRAINTS:
        raise unknown_name("constraint", name, CONSTRAINTS)
    builder = CONSTRAINTS[name]
    constraints = [] if builder is None else builder(
        n_classes=n_classes, n_groups=n_groups, gamma=gamma
    )
    return ConstraintSet.build(constraints, n_classes=n_classes, n_groups=n_groups)
