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


def register_resolvers() -> None:
    """What composing conf/ needs: the OmegaConf resolvers (``${raco_root:}`` is the project
    directory, ``${raco_cpus:}`` the usable cores), the ``raco`` sweeper's config and the SLURM launcher."""
    from omegaconf import OmegaConf

    from raco_cli.cli import slurm
    from raco_cli.cli.sweeper import register

    if not OmegaConf.has_resolver("raco_root"):
        OmegaConf.register_new_resolver("raco_root", lambda: str(PROJECT_ROOT))
    if not OmegaConf.has_resolver("raco_cpus"):
        OmegaConf.register_new_resolver("raco_cpus", cpu_count)
    register()
    slurm.register()


def group_options(group: str, extra_dirs: tuple[Path, ...] = ()) -> list[str]:
    """Option names of a config group (the YAML files in ``conf/<group>/`` and in
    ``<dir>/<group>/`` of every extra config directory, ``raco train --config-dir <dir>``)."""
    names: set[str] = set()
    for root in (CONF_DIR, *extra_dirs):
        d = Path(root) / group
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


GROUPS = ("dataset", "constraint", "method", "model", "tracking", "experiment", "debug", "sweep")
