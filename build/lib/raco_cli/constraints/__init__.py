"""Rate constraints as data: partition, subsets, alpha weights, gamma (paper Section 3)."""

from raco_cli.constraints.rate import (
    ConstraintSet,
    RateConstraint,
    RateTerm,
    clamp_denominators,
)
from raco_cli.constraints.registry import (
    COMBO,
    CONSTRAINTS,
    NAMES,
    PartSpec,
    build,
    build_parts,
    parse_parts,
    part_spec,
)

__all__ = [
    "COMBO",
    "CONSTRAINTS",
    "NAMES",
    "ConstraintSet",
    "PartSpec",
    "RateConstraint",
    "RateTerm",
    "build",
    "build_parts",
    "clamp_denominators",
    "parse_parts",
    "part_spec",
]
