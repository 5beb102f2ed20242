"""The bulk metric writer stores exactly what MLflow's log_batch stores.

Two runs of one SQLite store get the same metrics, one through ``client.log_batch`` and one
through :func:`log_metrics_bulk`; their histories and latest values must be equal, including
NaN and inf values, duplicates within a batch, steps logged out of order and a latest value
already in the store (newer or older than the batch).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("mlflow")

from raco_cli.tracking import bulk_metrics  # noqa: E402
from raco_cli.tracking.bulk_metrics import log_metrics_bulk  # noqa: E402


@pytest.fixture
def store(tmp_path):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = c.create_experiment("e", artifact_location=str(tmp_path / "art"))
    return c, exp


def _m(key, value, ts, step):
    from mlflow.entities import Metric

    return Metric(key, value, ts, step)


BATCH = [
    _m("train/accuracy", 0.5, 1000, 0),
    _m("train/accuracy", 0.7, 1000, 10),
    _m("train/accuracy", 0.6, 1000, 5),  # out of order: latest stays step 10
    _m("train/accuracy", 0.7, 1000, 10),  # exact duplicate within the batch: stored once
    _m("test/loss", float("nan"), 1000, 0),
    _m("test/loss", float("inf"), 1000, 1),
    _m("test/loss", -float("inf"), 1001, 1),  # same step, later timestamp: latest
    _m("test/tie", 1.0, 1000, 3),
    _m("test/tie", 2.0, 1000, 3),  # same step and timestamp: the greater value is latest
    _m("old/newer_in_store", 1.0, 1000, 2),
    _m("old/older_in_store", 1.0, 1000, 2),
]
EARLIER = [_m("old/newer_in_store", 9.0, 1000, 50), _m("old/older_in_store", 9.0, 1000, 1)]


def _state(c, run_id):
    run = c.get_run(run_id)
    latest = {k: (None if math.isnan(v) else v) for k, v in run.data.metrics.items()}
    hist = {
        k: sorted((m.step, m.timestamp, None if math.isnan(m.value) else m.value) for m in c.get_metric_history(run_id, k))
        for k in run.data.metrics
    }
    return latest, hist


@pytest.fixture
def no_fallback(monkeypatch):
    """The batch must go through the bulk path, not MLflow's per-run path."""

    def refuse(*_a, **_k):
        raise AssertionError("fell back to log_batch")

    monkeypatch.setattr(bulk_metrics, "_per_run", refuse)


def test_same_rows_and_latest_values_as_log_batch(store, no_fallback):
    c, exp = store
    ref, bulk = c.create_run(exp).info.run_id, c.create_run(exp).info.run_id
    for run_id in (ref, bulk):
        c.log_batch(run_id, metrics=EARLIER)
    c.log_batch(ref, metrics=BATCH)
    log_metrics_bulk(c, {bulk: BATCH})
    assert _state(c, bulk) == _state(c, ref)
    latest, hist = _state(c, bulk)
    assert latest["train/accuracy"] == 0.7 and latest["test/tie"] == 2.0 and latest["old/newer_in_store"] == 9.0
    assert latest["old/older_in_store"] == 1.0 and latest["test/loss"] == -1.7976931348623157e308
    assert len(hist["train/accuracy"]) == 3


def test_many_runs_in_chunks(store, monkeypatch, no_fallback):
    c, exp = store
    monkeypatch.setattr(bulk_metrics, "ROWS_PER_TRANSACTION", 25)  # several transactions
    runs = [c.create_run(exp).info.run_id for _ in range(6)]
    batches = {r: [_m(f"train/m{j}", float(i * 100 + j + s), 1000, s) for j in range(3) for s in range(4)] for i, r in enumerate(runs)}
    log_metrics_bulk(c, batches)
    for i, r in enumerate(runs):
        latest, hist = _state(c, r)
        assert latest == {f"train/m{j}": float(i * 100 + j + 3) for j in range(3)}
        assert all(len(h) == 4 for h in hist.values())


def test_rows_already_stored_fall_back_to_log_batch(store):
    """A batch repeating stored rows would break the primary key: MLflow's path skips them."""
    c, exp = store
    ref, bulk = c.create_run(exp).info.run_id, c.create_run(exp).info.run_id
    for run_id in (ref, bulk):
        c.log_batch(run_id, metrics=BATCH[:3])
    c.log_batch(ref, metrics=BATCH)
    log_metrics_bulk(c, {bulk: BATCH})
    assert _state(c, bulk) == _state(c, ref)


def test_deleted_run_refused_as_mlflow_refuses_it(store):
    from mlflow.exceptions import MlflowException

    c, exp = store
    run_id = c.create_run(exp).info.run_id
    c.delete_run(run_id)
    with pytest.raises(MlflowException, match="must be in the 'active' state"):
        log_metrics_bulk(c, {run_id: BATCH})


def test_invalid_metric_refused(store):
    from mlflow.exceptions import MlflowException

    c, exp = store
    run_id = c.create_run(exp).info.run_id
    with pytest.raises(MlflowException):
        log_metrics_bulk(c, {run_id: [_m("bad/..//key", 1.0, 1000, 0)]})
    assert c.get_run(run_id).data.metrics == {}


def test_other_stores_use_log_batch():
    calls = []

    class Client:  # not backed by MLflow's SQL store
        def log_batch(self, run_id, metrics):
            calls.append((run_id, len(metrics)))

    log_metrics_bulk(Client(), {"a": [_m("k", 1.0, 1, s) for s in range(2500)], "b": [], "c": [_m("k", 1.0, 1, 0)]})
    assert calls == [("a", 1000), ("a", 1000), ("a", 500), ("c", 1)]
