"""Where ``raco`` finds its configs and its working files.

The configs are package data (``raco_cli/conf``, ``raco_cli/sweeps``; a checkout's top-level
``conf/`` and ``sweeps/`` link there), so an installed wheel and an editable clone read the
same files.  ``PROJECT_ROOT`` is where the download cache ``datasets/`` lives by default: the
checkout when raco runs from one, else the working directory (as ``outputs/``);
``RACO_PROJECT_ROOT`` overrides it.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
CONF_DIR = PACKAGE_DIR / "conf"
SWEEPS_DIR = PACKAGE_DIR / "sweeps"


def _project_root() -> Path:
    if os.environ.get("RACO_PROJECT_ROOT"):
        return Path(os.environ["RACO_PROJECT_ROOT"])
    checkout = PACKAGE_DIR.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "raco_cli").resolve() == PACKAGE_DIR:
        return checkout
    return Path.cwd()


PROJECT_ROOT = _project_root()


def group_options(group: str, extra_dirs: tuple[Path, ...] = ()) -> list[str]:
    """Option names of a config group (the YAML files in ``conf/<group>/`` and in
    ``<dir>/<group>/`` of every extra config directory, ``raco train --config-dir <dir>``)."""
    names: set[str] = set()
    for root in (CONF_DIR, *extra_dirs):
        d = Path(root) / group
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


GROUPS = ("dataset", "constraint", "method", "model", "objective", "tracking", "experiment", "debug", "sweep")
