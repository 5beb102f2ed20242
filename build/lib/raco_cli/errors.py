"""Exception hierarchy and message templates.

Every user-facing error is a :class:`RacoError`; the CLI prints its message as one line
on stderr and exits with code 2.  Anything else escaping is a bug and keeps its traceback.
Templates live here as constants so tests can assert them verbatim.

This module imports nothing from the package.
"""

from __future__ import annotations

from collections.abc import Iterable


class RacoError(Exception):
    """Base class of every error a user can cause (bad config, missing data, budget)."""


class ConfigError(RacoError, ValueError):
    """A configuration value is invalid (type, range, unknown name)."""


class DataNotFoundError(RacoError, FileNotFoundError):
    """A dataset file is missing; the message names the command that fetches it."""


class DataIntegrityError(RacoError, ValueError):
    """A dataset file exists but is corrupted, truncated or malformed."""


class PrivacyBudgetError(RacoError, ValueError):
    """The requested (eps, delta) cannot be met with the requested mechanism settings."""


class UnsupportedError(RacoError, ValueError):
    """A method cannot honour a requested combination (e.g. a constraint it does not model)."""


class TrackingError(RacoError, RuntimeError):
    """The experiment store cannot be written or read."""


class OutputError(RacoError, OSError):
    """The run directory cannot be written (read-only, full disk, not a directory)."""


class NoRunsError(RacoError, LookupError):
    """A figure or report has no finished runs to read; the message names the sweep to run."""


# --- message templates --------------------------------------------------------------------

UNKNOWN_NAME = "Unknown {kind} '{name}'. Available: {available}."
EPS_RANGE = "eps must be > 0 (got eps={value}); eps is the total privacy budget of the run."
DELTA_RANGE = (
    "delta must be in (0, 1) (got delta={value}); delta is the failure probability of the "
    "(eps, delta) guarantee, typically 1e-5 or below 1/n."
)
GAMMA_RANGE = (
    "constraint.gamma must be >= 0 (got {value}); gamma is the allowed gap of each rate constraint."
)
POSITIVE = "{key} must be > 0 (got {key}={value}); {meaning}"
NON_NEGATIVE = "{key} must be >= 0 (got {key}={value}); {meaning}"
IN_RANGE = "{key} must be in {interval} (got {key}={value}); {meaning}"
CHOICE = "{key} must be one of {choices} (got {key}={value!r}); {meaning}"
TYPE = "{key} must be {expected} (got {key}={value!r}); {meaning}"
MISSING_DATA = "Missing data file {path}. Download it with: {command}"
MISSING_MANUAL_DATA = "Missing data file {path}. {hint}"
CHECKSUM = (
    "Checksum mismatch for {path}: expected sha256 {expected}, got {actual}. The file is "
    "corrupted or truncated; delete it and fetch it again with: {command}"
)
UNREACHABLE_BUDGET = (
    "Cannot reach eps={eps} (delta={delta}, sample_rate={sample_rate:.4g}, {mechanism}): "
    "a single step already spends eps={eps_one:.4g}. Increase the noise multipliers or lower "
    "the batch size."
)
BUDGET_EXCEEDED = (
    "Cannot reach eps={eps} (delta={delta}, steps={steps}, sample_rate={sample_rate:.4g}, "
    "{mechanism}): the run would spend eps={eps_spent:.4g}. Lower method.steps, or set "
    "method.steps=null to derive the steps from the budget."
)
OUTPUT_NOT_WRITABLE = (
    "Cannot write to the output directory {path}: {reason}. Free some space or choose a "
    "writable location with hydra.run.dir=<dir> (sweeps: hydra.sweep.dir=<dir>)."
)
NO_RUNS = (
    "No finished runs for {what} in MLflow experiment '{experiment}' ({uri}). "
    "Run the sweep first: make sweep-{sweep}{smoke}"
)
NOISE_UNREACHABLE = (
    "Cannot reach eps={eps} (delta={delta}, steps={steps}, sample_rate={sample_rate:.4g}): "
    "noise multiplier > {limit:g}. Lower method.steps or the batch size."
)


def available(names: Iterable[str]) -> str:
    """Format a sorted, comma-separated list of names for error messages."""
    return ", ".join(sorted(names))


def unknown_name(kind: str, name: object, names: Iterable[str]) -> ConfigError:
    """Build the standard 'Unknown <kind>' error."""
    return ConfigError(UNKNOWN_NAME.format(kind=kind, name=name, available=available(names)))
