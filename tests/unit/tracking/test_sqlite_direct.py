"""Reads (and the parent run's end) by SQL give what MLflow's client gives on the same store.

One store holds the cases a sweep's resume, its figures and its parent run must tell apart:
FINISHED, FAILED and RUNNING runs with a config hash, a FINISHED run deleted afterwards, a
FINISHED run without the tag, a run of another experiment, an experiment that was deleted, and
params, tags and metrics including NaN, inf and a value logged at several steps.
"""

from __future__ import annotations

import pytest

pytest.importorskip("mlflow")

from raco_cli.tracking import mlflow_store, sqlite_direct  # noqa: E402


@pytest.fixture
def store(tmp_path):
    from mlflow.tracking import MlflowClient

    db = tmp_path / "mlflow.db"
    c = MlflowClient(f"sqlite:///{db}")
    exp = c.create_experiment("e", artifact_location=str(tmp_path / "art"))
    other = c.create_experiment("other", artifact_location=str(tmp_path / "art2"))
    gone = c.create_experiment("gone", artifact_location=str(tmp_path / "art3"))

    def run(experiment: str, status: str | None, tag: str | None, *, delete: bool = False) -> None:
        r = c.create_run(experiment, tags={"raco.config_hash": tag, "sweep": "s"} if tag else {})
        c.log_param(r.info.run_id, "method.name", "raco_dp")
        c.log_param(r.info.run_id, "eps", str(len(tag or "")))
        for step, value in enumerate((0.5, float("nan"), 0.7)):
            c.log_metric(r.info.run_id, "test/accuracy", value, step=step)
        c.log_metric(r.info.run_id, "test/loss", float("nan"))
        c.log_metric(r.info.run_id, "test/gap", float("inf"))
        if status:
            c.set_terminated(r.info.run_id, status=status)
        if delete:
            c.delete_run(r.info.run_id)

    run(exp, "FINISHED", "h1")
    run(exp, "FINISHED", "h2")
    run(exp, "FAILED", "h3")
    run(exp, None, "h4")  # RUNNING
    run(exp, "FINISHED", "h5", delete=True)
    run(exp, "FINISHED", None)
    run(other, "FINISHED", "h6")
    run(gone, "FINISHED", "h7")
    c.delete_experiment(gone)
    return db


def _by_mlflow(uri: str, experiment: str) -> set[str]:
    runs = mlflow_store.find_runs(uri, experiment, filter_string="attributes.status = 'FINISHED'")
    return {h for r in runs if (h := r.data.tags.get("raco.config_hash"))}


@pytest.mark.parametrize("experiment", ["e", "other", "gone", "absent"])
def test_finished_config_hashes_by_sql_equal_mlflows(store, experiment):
    uri = f"sqlite:///{store}"
    by_sql = sqlite_direct.finished_config_hashes(store, experiment)
    assert by_sql == _by_mlflow(uri, experiment)
    assert mlflow_store.finished_config_hashes(uri, experiment) == by_sql
    if experiment == "e":
        assert by_sql == {"h1", "h2"}


def test_a_store_sql_cannot_read_is_asked_through_mlflow(store, monkeypatch):
    import sqlite3

    def broken(db, experiment):
        raise sqlite3.OperationalError("no such table: tags")

    monkeypatch.setattr(sqlite_direct, "finished_config_hashes", broken)
    assert mlflow_store.finished_config_hashes(f"sqlite:///{store}", "e") == {"h1", "h2"}


def test_reading_never_creates_a_store(tmp_path):
    assert mlflow_store.finished_config_hashes(f"sqlite:///{tmp_path / 'none.db'}", "e") == set()
    assert not (tmp_path / "none.db").exists()


def _same(a, b):
    """Records equal, NaN equal to NaN."""
    import math

    def norm(v):
        return "nan" if isinstance(v, float) and math.isnan(v) else v

    def walk(x):
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return norm(x)

    return walk(a) == walk(b)


@pytest.mark.parametrize("experiment", ["e", "other", "gone", "absent"])
def test_run_records_by_sql_equal_mlflows_in_the_same_order(store, experiment, monkeypatch):
    uri = f"sqlite:///{store}"
    by_sql = mlflow_store.run_records(uri, experiment)
    monkeypatch.setattr(mlflow_store, "_by_sql", lambda *a: None)
    by_mlflow = mlflow_store.run_records(uri, experiment)
    assert _same(by_sql, by_mlflow)
    if experiment == "e":
        assert [r["status"] for r in by_sql] == ["RUNNING", "FAILED", "FINISHED", "FINISHED"]  # newest first
        assert by_sql[0]["metrics"]["test/accuracy"] == 0.7 and by_sql[0]["metrics"]["test/gap"] == 1.7976931348623157e308


@pytest.mark.parametrize("child_status", ["FINISHED", "FAILED", "RUNNING", "deleted FAILED"])
def test_the_sweeps_parent_run_ends_as_mlflow_ends_it(tmp_path, child_status, monkeypatch):
    import shutil

    from mlflow.tracking import MlflowClient

    db = tmp_path / "a" / "mlflow.db"
    db.parent.mkdir()
    c = MlflowClient(f"sqlite:///{db}")
    exp = c.create_experiment("e", artifact_location=str(tmp_path / "art"))
    parent = c.create_run(exp).info.run_id
    for status in ("FINISHED", child_status):
        child = c.create_run(exp, tags={"mlflow.parentRunId": parent}).info.run_id
        if status != "RUNNING":
            c.set_terminated(child, status=status.split()[-1])
        if status.startswith("deleted"):
            c.delete_run(child)
    other_exp = c.create_experiment("f", artifact_location=str(tmp_path / "art2"))  # not a child: another experiment
    c.set_terminated(c.create_run(other_exp, tags={"mlflow.parentRunId": parent}).info.run_id, status="FAILED")
    copy = tmp_path / "b" / "mlflow.db"
    copy.parent.mkdir()
    shutil.copy(db, copy)
    for d in (db.parent, copy.parent):
        (d / mlflow_store.PARENT_FILE).write_text(parent)

    mlflow_store.close_sweep(f"sqlite:///{db}", db.parent)
    with monkeypatch.context() as m:  # the copy through MLflow's client
        m.setattr(mlflow_store, "_by_sql", lambda *a: None)
        mlflow_store.close_sweep(f"sqlite:///{copy}", copy.parent)
    by_sql, by_mlflow = (MlflowClient(f"sqlite:///{p}").get_run(parent).info for p in (db, copy))
    assert by_sql.status == by_mlflow.status == ("FINISHED" if child_status in ("FINISHED", "deleted FAILED") else "FAILED")
    assert abs(by_sql.end_time - by_mlflow.end_time) < 60_000


def test_ending_a_deleted_parent_leaves_it_to_mlflow(store):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{store}")
    run = c.create_run(c.get_experiment_by_name("e").experiment_id)
    c.delete_run(run.info.run_id)
    assert sqlite_direct.end_parent_run(store, run.info.run_id) is None
    assert sqlite_direct.end_parent_run(store, "no-such-run") is None
