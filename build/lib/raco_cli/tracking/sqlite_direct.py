"""MLflow's SQLite store read by SQL (and a sweep's parent run ended), without importing MLflow.

A sweep command asks its store which configs already have a FINISHED run (resume) before it
launches anything, and ends the sweep's parent run after; ``raco figures`` and ``raco report``
read every run of an experiment.  Through MLflow each costs the import and the store's set-up
(~2-3 s a command) and a ``search_runs`` that builds an object per run, param, tag and metric
(~5 s for fig4_adult's 1 360 runs, once per sweep command and figure that reads them).  The same
answers are a few queries on MLflow's own tables (``experiments``, ``runs``, ``params``,
``tags``, ``latest_metrics``), whose layout MLflow has kept since 1.x; the one write is the
UPDATE ``set_terminated`` makes (status and end time of an active run).

The callers (:mod:`raco_cli.tracking.mlflow_store`) use MLflow's client for any other store,
and when a query fails (:class:`sqlite3.Error`: a schema this code does not know).
tests/unit/tracking/test_sqlite_direct.py compares both paths on one store.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_BUSY_TIMEOUT_S = 20.0  # as the writers' (parallel group jobs hold the lock while they flush)
# the runs of an experiment by name, not deleted (MLflow's search_runs: active runs only)
_RUNS = ("SELECT r.run_uuid, r.status FROM experiments e JOIN runs r ON r.experiment_id = e.experiment_id"
         " WHERE e.name = ? AND r.lifecycle_stage = 'active'")


@contextmanager
def _connect(db: Path, *, write: bool = False) -> Iterator[sqlite3.Connection]:
    """A connection in one transaction; read-only unless ``write`` (never creates the file)."""
    mode = "rw" if write else "ro"
    conn = sqlite3.connect(f"{Path(db).resolve().as_uri()}?mode={mode}", uri=True, timeout=_BUSY_TIMEOUT_S)
    try:
        with conn:  # commit at the end, roll back on an exception
            yield conn
    finally:
        conn.close()


def finished_config_hashes(db: Path, experiment: str) -> set[str]:
    """``raco.config_hash`` tags of the FINISHED, not deleted runs of the experiment named
    ``experiment``: what ``search_runs`` with ``attributes.status = 'FINISHED'`` gives."""
    with _connect(db) as conn:
        rows = conn.execute(
            f"SELECT t.value FROM ({_RUNS} AND r.status = 'FINISHED') f JOIN tags t ON t.run_uuid = f.run_uuid"
            " WHERE t.key = 'raco.config_hash'",
            (experiment,),
        ).fetchall()
    return {value for (value,) in rows if value}


def run_records(db: Path, experiment: str) -> list[dict[str, Any]]:
    """Every run of the experiment tagged ``raco.config_hash``, in ``search_runs``' order, as
    :func:`raco_cli.tracking.mlflow_store.run_records` returns them: ``run_id``, ``status``,
    ``params``, ``metrics`` (the latest values; NaN stored as MLflow stores it: ``is_nan``)
    and ``tags``."""
    with _connect(db) as conn:
        # search_runs' order: newest start first, then by id (runs without process timing share
        # their day's start time: among them the order is by the random run id, which tells no time)
        runs = conn.execute(f"{_RUNS} ORDER BY r.start_time DESC, r.run_uuid", (experiment,)).fetchall()
        records = {run_id: {"run_id": run_id, "status": status, "params": {}, "metrics": {}, "tags": {}} for run_id, status in runs}
        scope = f"SELECT run_uuid FROM ({_RUNS})"
        for run_id, key, value in conn.execute(f"SELECT run_uuid, key, value FROM tags WHERE run_uuid IN ({scope})", (experiment,)):
            records[run_id]["tags"][key] = value
        for run_id, key, value in conn.execute(f"SELECT run_uuid, key, value FROM params WHERE run_uuid IN ({scope})", (experiment,)):
            records[run_id]["params"][key] = value
        for run_id, key, value, is_nan in conn.execute(
            f"SELECT run_uuid, key, value, is_nan FROM latest_metrics WHERE run_uuid IN ({scope})", (experiment,)
        ):
            records[run_id]["metrics"][key] = float("nan") if is_nan else float(value)
    return [r for r in records.values() if "raco.config_hash" in r["tags"]]


def end_parent_run(db: Path, parent: str) -> str | None:
    """End a sweep's parent run as ``set_terminated`` does: FINISHED when every (not deleted)
    child run tagged ``mlflow.parentRunId = parent`` is FINISHED, else FAILED; the end time is
    now in ms, or its start time when the parent carries no process timing (tag ``raco.timed`` =
    ``false``: a sweep of private scope=model runs).  A parent that is deleted or absent is left
    alone (None); else the status set."""
    with _connect(db, write=True) as conn:
        conn.execute("BEGIN IMMEDIATE")  # the check and the update in one write transaction
        if conn.execute("SELECT 1 FROM runs WHERE run_uuid = ? AND lifecycle_stage = 'active'", (parent,)).fetchone() is None:
            return None
        unfinished = conn.execute(
            "SELECT COUNT(*) FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid"
            " WHERE t.key = 'mlflow.parentRunId' AND t.value = ? AND r.lifecycle_stage = 'active' AND r.status != 'FINISHED'"
            " AND r.experiment_id = (SELECT experiment_id FROM runs WHERE run_uuid = ?)",
            (parent, parent),
        ).fetchone()[0]
        status = "FAILED" if unfinished else "FINISHED"
        untimed = conn.execute("SELECT 1 FROM tags WHERE run_uuid = ? AND key = 'raco.timed' AND value = 'false'",
                               (parent,)).fetchone() is not None
        conn.execute("UPDATE runs SET status = ?, end_time = CASE WHEN ? THEN start_time ELSE ? END WHERE run_uuid = ?",
                     (status, untimed, int(time.time() * 1000), parent))
    return status
