"""Retrying a tracking-store call that failed for contention, not for its content.

A SQLite store shared by parallel jobs answers "database is locked" under load; MLflow calls
are idempotent per run id (metrics carry their step and timestamp), so a retry cannot duplicate
a record.  Its own module because both :mod:`raco_cli.tracking.mlflow_store` and the bulk metric
writer it calls (:mod:`raco_cli.tracking.bulk_metrics`) retry.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
RETRIES = 12


def _is_transient(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(s in text for s in ("database is locked", "database table is locked", "busy", "connection refused", "temporarily unavailable", "max retries exceeded"))


def retrying(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn`` and retry with jittered exponential backoff on transient store errors."""
    for attempt in range(RETRIES):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - MLflow raises many types for the same lock
            if attempt == RETRIES - 1 or not _is_transient(exc):
                raise
            time.sleep(min(5.0, 0.05 * 2**attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")
