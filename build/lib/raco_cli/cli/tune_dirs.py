"""Where a private search (``raco tune``, privacy.scope=model) writes: a directory of its own.

Every search gets one, never shared with another search: ``<tune.out>/<study>-<k>`` with the
first ``k = 1, 2, ...`` not yet taken (the study is named after the dataset as runs name it, a
table's own name included), or exactly ``hydra.run.dir`` when given, which must not already hold
a search's result.  A counter and not a clock: the directory name reaches the MLflow run's
``raco.run_dir`` tag, and under ``privacy.scope=model`` records carry no process timing.

The directory is claimed with an atomic ``mkdir`` when the result is written (two searches
finishing at once take two numbers; a search that fails leaves no empty directory).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from raco_cli.errors import OUTPUT_NOT_WRITABLE, ConfigError, OutputError

RESULT = ("best", "best.yaml")  # what a search writes into its directory


def run_dir_override(overrides: Sequence[str]) -> Path | None:
    """``hydra.run.dir=<dir>`` of the command line (the last one), None when not given.

    >>> run_dir_override(["eps=1", "hydra.run.dir=/tmp/s"]), run_dir_override(["eps=1"])
    (PosixPath('/tmp/s'), None)
    """
    found = None
    for o in overrides:
        key, sep, value = o.lstrip("+").partition("=")
        if key == "hydra.run.dir" and sep:
            if not value:
                raise ConfigError("hydra.run.dir is empty (got hydra.run.dir=); give the directory the search writes to, "
                                  "e.g. hydra.run.dir=outputs/tune/mine, or leave it out (tune.out/<study>-<k>).")
            found = Path(value).expanduser()
    return found


def check_free(directory: Path) -> None:
    """One line when ``directory`` already holds a search's result (before any planning)."""
    taken = [name for name in RESULT if (directory / name).exists()]
    if taken:
        raise ConfigError(f"hydra.run.dir={directory} already holds a search's result ({directory / taken[0]}); a search "
                          "never replaces another: give a new directory, or leave hydra.run.dir out (tune.out/<study>-<k>).")


def claim(out: Path, study: str, fixed: Path | None = None) -> Path:
    """The search's own directory, created: ``fixed`` (hydra.run.dir; still free), else
    ``out/<study>-<k>`` for the first k whose directory did not exist.

    Raises:
        ConfigError: ``fixed`` holds a search's result (another search finished there meanwhile).
        OutputError: the directory cannot be created.
    """
    try:
        if fixed is not None:
            check_free(fixed)
            fixed.mkdir(parents=True, exist_ok=True)
            return fixed
        out.mkdir(parents=True, exist_ok=True)
        k = 1
        while True:
            candidate = out / f"{study}-{k}"
            try:
                candidate.mkdir()  # atomic: exactly one search gets each number
                return candidate
            except FileExistsError:
                k += 1
    except OSError as exc:
        raise OutputError(OUTPUT_NOT_WRITABLE.format(path=fixed or out, reason=exc.strerror or exc)) from None
