"""Smallest noise the accountant takes (no heavy imports: the config layer checks these).

Below these scales one step costs an eps in the hundreds and the privacy loss distribution
of dp-accounting no longer fits in time or memory (measured: Gaussian sigma 0.1 -> 10 s and
0.4 GB for one step at q = 0.035; 0.03 -> 66 s and 1.6 GB; 0.01 -> over 4 GB; a Laplace scale
of 0.001 overflows).  Such a run is not private in any useful sense, so it is refused with one
line instead; training without noise is what the non-private methods (sgd, sgda) are for.
"""

from __future__ import annotations

from raco_cli.errors import ConfigError

MIN_NOISE_MULTIPLIER = 0.1  # Gaussian sigma (noise std / clipping norm)
MIN_LAPLACE_SCALE = 0.01  # Laplace scale per unit l1 sensitivity (1 / the paper's b)
# PLD loss grid: a PLD has (loss range / discretization) points, so finer grids take gigabytes
DISCRETIZATION_RANGE = (1e-6, 0.1)


def check_discretization(key: str, value: float) -> None:
    """Raise a one-line ConfigError for a PLD grid outside :data:`DISCRETIZATION_RANGE`.

    >>> check_discretization("privacy.discretization", 1e-4)
    """
    lo, hi = DISCRETIZATION_RANGE
    if not lo <= value <= hi:
        raise ConfigError(f"{key} must be in [{lo:g}, {hi:g}] (got {value:g}); it is the PLD loss grid "
                          "(default 1e-4; smaller is tighter and slower).")


def check_noise(key: str, value: float | None, *, laplace: bool = False) -> None:
    """Raise a one-line ConfigError when ``value`` is below what the accountant can handle.

    >>> check_noise("method.noise_multiplier", 0.5)
    >>> check_noise("method.noise_multiplier", 1e-31)
    Traceback (most recent call last):
    ...
    raco_cli.errors.ConfigError: method.noise_multiplier must be >= 0.1 (got method.noise_multiplier=1e-31): smaller noise costs eps in the hundreds per step and the accountant cannot represent it; for training without noise use method=sgda or method=sgd.
    """
    floor = MIN_LAPLACE_SCALE if laplace else MIN_NOISE_MULTIPLIER
    if value is not None and value < floor * (1.0 - 1e-9):  # tolerance: calibration scales noise down to the floor
        raise ConfigError(
            f"{key} must be >= {floor:g} (got {key}={value:g}): smaller noise costs eps in the hundreds per step "
            "and the accountant cannot represent it; for training without noise use method=sgda or method=sgd."
        )
