"""Where the installed ``raco`` finds its configs: ``conf/`` beside the package (editable install)."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(os.environ.get("RACO_PROJECT_ROOT") or Path(__file__).resolve().parents[2])
CONF_DIR = PROJECT_ROOT / "conf"
SWEEPS_DIR = PROJECT_ROOT / "sweeps"


def cpu_count() -> int:
    """Cores this process may use (affinity-aware); ``RACO_JOBS`` overrides it."""
    env = os.environ.get("RACO_JOBS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS
        return max(1, os.cpu_count() or 1)


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
