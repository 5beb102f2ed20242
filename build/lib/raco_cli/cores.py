"""The cores this process may use, for every layer that sizes a pool of workers by them (the
parallel planning of a sweep group's runs, joblib's ``n_jobs=-1``, ``${raco_cpus:}`` in conf/)."""

from __future__ import annotations

import os


def cpu_count() -> int:
    """Cores this process may use (affinity-aware); ``RACO_JOBS`` overrides it."""
    env = os.environ.get("RACO_JOBS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS
        return max(1, os.cpu_count() or 1)
