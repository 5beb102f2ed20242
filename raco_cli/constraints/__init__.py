"""Rate constraints as data: partition, subsets, alpha weights, gamma (paper Section 3)."""

from raco_cli.constraints.rate import (
    ConstraintSet,
    RateConstraint,
    RateTerm,
    clamp_denominators,
)
from raco_cli.constraints.registry import CONSTRAINTS, build

__all__ = [
    "CONSTRAINTS",
    "ConstraintSet",
    "RateConstraint",
    "RateTerm",
    "build",
    "clamp_denominators",
]
