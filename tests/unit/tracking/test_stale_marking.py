"""Marking stale runs is housekeeping: a race with another process must not fail the caller.

The jobs of a sweep start together and each marks the stale runs of its experiment before it
opens its own run; two of them may mark the same run at once (SQLite then rejects the second
insert of the ``raco.stale_reason`` tag: a whole fig9_low_eps group of 102 runs was lost so).
"""

from __future__ import annotations

import socket
import subprocess

import pytest

pytest.importorskip("mlflow")


@pytest.fixture
def store(tmp_path):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = c.create_experiment("e", artifact_location=str(tmp_path / "art"))
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid whose process has exited: the run it tags is stale
    run = c.create_run(exp, tags={"raco.host": socket.gethostname(), "raco.pid": str(gone.pid)})
    return c, exp, run.info.run_id


class _Racing:
    """A client whose ``set_tag`` loses a race: another process marks the run first, then the
    insert fails as SQLite's unique key makes it fail."""

    def __init__(self, c, *, other_wins: bool) -> None:
        self._c, self._other_wins = c, other_wins

    def __getattr__(self, name):
        return getattr(self._c, name)

    def set_tag(self, run_id, key, value):
        from mlflow.exceptions import MlflowException

        if self._other_wins:
            self._c.set_tag(run_id, key, "marked by the other job")
            self._c.set_terminated(run_id, status="FAILED")
        raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: tags.key, tags.run_uuid")


def test_a_run_marked_by_another_process_does_not_fail_the_caller(store, caplog):
    from raco_cli.tracking.mlflow_store import mark_stale_runs

    caplog.set_level("INFO", logger="raco_cli.tracking.mlflow_store")
    c, exp, run_id = store
    marked = mark_stale_runs(_Racing(c, other_wins=True), exp)
    assert [m[0] for m in marked] == [run_id]
    assert c.get_run(run_id).info.status == "FAILED"
    assert "marked by another process" in caplog.text


def test_a_mark_that_fails_for_another_reason_is_reported_and_skipped(store, caplog):
    from raco_cli.tracking.mlflow_store import mark_stale_runs

    c, exp, run_id = store
    mark_stale_runs(_Racing(c, other_wins=False), exp)  # must not raise
    assert c.get_run(run_id).info.status == "RUNNING"
    assert "Could not mark stale MLflow run" in caplog.text
    assert mark_stale_runs(c, exp)[0][0] == run_id and c.get_run(run_id).info.status == "FAILED"  # a later call marks it
