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


def _plain(metrics):
    """The (key, value, timestamp, step) tuples a buffered recorder keeps."""
    return [(m.key, m.value, m.timestamp, m.step) for m in metrics]


@pytest.mark.parametrize("form", [list, _plain])
def test_same_rows_and_latest_values_as_log_batch(store, no_fallback, form):
    c, exp = store
    ref, bulk = c.create_run(exp).info.run_id, c.create_run(exp).info.run_id
    for run_id in (ref, bulk):
        c.log_batch(run_id, metrics=EARLIER)
    c.log_batch(ref, metrics=BATCH)
    log_metrics_bulk(c, {bulk: form(BATCH)})
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


@pytest.mark.parametrize("form", [list, _plain])
def test_rows_already_stored_fall_back_to_log_batch(store, form):
    """A batch repeating stored rows would break the primary key: MLflow's path skips them
    (plain tuples become MLflow's entities for it)."""
    c, exp = store
    ref, bulk = c.create_run(exp).info.run_id, c.create_run(exp).info.run_id
    for run_id in (ref, bulk):
        c.log_batch(run_id, metrics=BATCH[:3])
    c.log_batch(ref, metrics=BATCH)
    log_metrics_bulk(c, {bulk: form(BATCH)})
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


@pytest.mark.parametrize("bad", [(True, 1001, 1), ("0.5", 1001, 1), (None, 1001, 1), (0.5, -1, 1), (0.5, 1001, "1")])
def test_a_bad_row_after_a_good_row_of_its_key_is_refused(store, bad):
    """The key's name is checked once per batch; each row's value, timestamp and step still are
    (a bool, string or missing value, a negative timestamp, a string step)."""
    from mlflow.exceptions import MlflowException

    c, exp = store
    run_id = c.create_run(exp).info.run_id
    with pytest.raises(MlflowException):
        log_metrics_bulk(c, {run_id: [_m("test/accuracy", 0.5, 1000, 0), _m("test/accuracy", *bad)]})
    assert c.get_run(run_id).data.metrics == {}


def test_other_stores_use_log_batch():
    calls = []

    class Client:  # not backed by MLflow's SQL store
        def log_batch(self, run_id, metrics):
            calls.append((run_id, len(metrics)))

    log_metrics_bulk(Client(), {"a": [_m("k", 1.0, 1, s) for s in range(2500)], "b": [], "c": [_m("k", 1.0, 1, 0)]})
    assert calls == [("a", 1000), ("a", 1000), ("a", 500), ("c", 1)]


# params and tags (a group's runs open and close in one transaction each)

def _params(n, prefix="p"):
    from mlflow.entities import Param

    return [Param(f"{prefix}{i}", f"v{i}") for i in range(n)]


def _tags(**kv):
    from mlflow.entities import RunTag

    return [RunTag(k, v) for k, v in kv.items()]


def _pt_state(c, run_id):
    d = c.get_run(run_id).data
    return dict(d.params), {k: v for k, v in d.tags.items() if k != "mlflow.runName"}


def test_params_and_tags_as_log_batch_stores_them(store, monkeypatch):
    """150 params (more than one MLflow request), tags replacing stored values and a key set
    twice in the batch (the last wins): the same records as log_batch's, in one transaction."""
    from raco_cli.tracking.bulk_metrics import log_params_tags_bulk

    c, exp = store
    ref, bulk = (c.create_run(exp, tags={"a": "old", "keep": "1"}).info.run_id for _ in range(2))
    params, tags = _params(150), [*_tags(a="new", b="x"), *_tags(b="y")]
    for start in range(0, 150, 100):
        c.log_batch(ref, params=params[start : start + 100], tags=tags if start == 0 else [])
    monkeypatch.setattr(c, "log_batch", lambda *a, **k: pytest.fail("fell back to log_batch"))
    log_params_tags_bulk(c, {bulk: (params, tags)})
    assert _pt_state(c, bulk) == _pt_state(c, ref)
    assert _pt_state(c, bulk)[1] == {"a": "new", "b": "y", "keep": "1"} and len(_pt_state(c, bulk)[0]) == 150


def test_many_runs_params_then_tags(store, monkeypatch):
    from raco_cli.tracking.bulk_metrics import log_params_tags_bulk

    c, exp = store
    runs = [c.create_run(exp).info.run_id for _ in range(5)]
    monkeypatch.setattr(c, "log_batch", lambda *a, **k: pytest.fail("fell back to log_batch"))
    log_params_tags_bulk(c, {r: (_params(3, prefix=f"r{i}."), []) for i, r in enumerate(runs)})
    log_params_tags_bulk(c, {r: ([], _tags(done=str(i))) for i, r in enumerate(runs)})
    for i, r in enumerate(runs):
        assert _pt_state(c, r) == ({f"r{i}.{j}": f"v{j}" for j in range(3)}, {"done": str(i)})


def test_a_param_already_logged_is_mlflows_decision(store):
    """The same value again is accepted, a different one is MLflow's error (its per-run path)."""
    from mlflow.exceptions import MlflowException

    from raco_cli.tracking.bulk_metrics import log_params_tags_bulk

    c, exp = store
    run_id = c.create_run(exp).info.run_id
    c.log_batch(run_id, params=_params(2))
    log_params_tags_bulk(c, {run_id: (_params(3), [])})
    assert len(_pt_state(c, run_id)[0]) == 3
    from mlflow.entities import Param

    with pytest.raises(MlflowException, match="Changing param values is not allowed"):
        log_params_tags_bulk(c, {run_id: ([Param("p0", "other")], [])})


def test_bad_params_tags_refused_and_nothing_written(store):
    from mlflow.entities import Param
    from mlflow.exceptions import MlflowException

    from raco_cli.tracking.bulk_metrics import log_params_tags_bulk

    c, exp = store
    ok, bad = c.create_run(exp).info.run_id, c.create_run(exp).info.run_id
    with pytest.raises(MlflowException):
        log_params_tags_bulk(c, {ok: (_params(2), []), bad: ([Param("bad/..//key", "1")], [])})
    assert _pt_state(c, ok) == ({}, {})
    deleted = c.create_run(exp).info.run_id
    c.delete_run(deleted)
    with pytest.raises(MlflowException, match="must be in the 'active' state"):
        log_params_tags_bulk(c, {deleted: (_params(1), [])})


def test_params_tags_on_other_stores_use_log_batch():
    from raco_cli.tracking.bulk_metrics import log_params_tags_bulk

    calls = []

    class Client:  # not backed by MLflow's SQL store
        def log_batch(self, run_id, params, tags):
            calls.append((run_id, len(params), len(tags)))

    log_params_tags_bulk(Client(), {"a": (_params(230), _tags(x="1")), "b": ([], []), "c": ([], _tags(y="2"))})
    assert calls == [("a", 100, 1), ("a", 100, 0), ("a", 30, 0), ("c", 0, 1)]


def test_a_buffered_recorder_writes_params_and_tags_when_flushed(tmp_path):
    """A group's recorder keeps its params and tags until flush_recorders; a one-run recorder
    writes its params when opened."""
    from raco_cli.tracking.mlflow_store import RunRecorder, flush_recorders

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    one = RunRecorder(uri=uri, experiment="e", run_name="one", params={"a": {"b": 1}}, tags={"t": "1"})
    assert one.client.get_run(one.run_id).data.params == {"a.b": "1"}
    recs = [RunRecorder(uri=uri, experiment="e", run_name=f"g{i}", params={"seed": i}, tags={}, client=one.client, buffered=True)
            for i in range(3)]
    assert all(one.client.get_run(r.run_id).data.params == {} for r in recs)
    flush_recorders(recs)
    for i, r in enumerate(recs):
        r.set_tags({"satisfied": "true"})
        assert one.client.get_run(r.run_id).data.params == {"seed": str(i)}
        assert "satisfied" not in one.client.get_run(r.run_id).data.tags
    flush_recorders(recs)
    assert all(one.client.get_run(r.run_id).data.tags["satisfied"] == "true" for r in recs)




# runs created in one transaction

def test_runs_created_as_create_run_creates_them(store):
    """The same info, tags and (empty) data as MLflow's create_run, each run its own id and
    artifact directory, a start time of now; params and metrics can be logged to them."""
    import time

    from raco_cli.tracking.bulk_metrics import create_runs_bulk

    c, exp = store
    tags = {"method": "raco_dp", "mlflow.user": "alice", "raco.seed.noise": "7"}
    ref = c.create_run(exp, run_name="r", tags=tags).info.run_id
    before = int(time.time() * 1000)
    created = create_runs_bulk(c, exp, [("r", tags), ("r", {**tags, "mlflow.runName": "r"}), ("r", tags)])
    after = int(time.time() * 1000)
    ids = [run_id for run_id, _ in created]
    assert len(set(ids)) == 3 and ref not in ids
    assert [uri for _, uri in created] == [c.get_run(run_id).info.artifact_uri for run_id in ids]

    def view(run_id):
        run = c.get_run(run_id)
        info = {k: v for k, v in vars(run.info).items() if k not in ("_run_id", "_run_uuid", "_artifact_uri", "_start_time")}
        return info, run.data.tags, run.data.params, run.data.metrics, run.info.artifact_uri.replace(run_id, "<id>")

    for run_id in ids:
        assert view(run_id) == view(ref)
        assert before <= c.get_run(run_id).info.start_time <= after
    assert c.get_run(ids[0]).info.user_id == "alice"
    c.log_batch(ids[0], metrics=BATCH[:2])
    log_metrics_bulk(c, {ids[1]: BATCH[:2]})
    assert [r.info.run_id for r in c.search_runs([exp], filter_string="tags.method = 'raco_dp'")].count(ids[2]) == 1


def test_creating_runs_in_a_deleted_experiment_or_under_two_names_is_mlflows_error(store):
    from mlflow.exceptions import MlflowException

    from raco_cli.tracking.bulk_metrics import create_runs_bulk

    c, exp = store
    with pytest.raises(MlflowException, match="Both 'run_name' argument and 'mlflow.runName' tag are specified"):
        create_runs_bulk(c, exp, [("a", {"mlflow.runName": "b"})])
    c.delete_experiment(exp)
    with pytest.raises(MlflowException, match="must be in the 'active' state"):
        create_runs_bulk(c, exp, [("a", {})])
    assert c.search_runs([exp], run_view_type=3) == []  # (ALL): nothing was written


def test_creating_runs_on_other_stores_uses_create_run():
    from types import SimpleNamespace

    from raco_cli.tracking.bulk_metrics import create_runs_bulk

    calls = []

    class Client:  # not backed by MLflow's SQL store
        def create_run(self, experiment_id, run_name, tags):
            calls.append((experiment_id, run_name, tags))
            return SimpleNamespace(info=SimpleNamespace(run_id=f"id{len(calls)}", artifact_uri=f"s3://b/id{len(calls)}"))

    assert create_runs_bulk(Client(), "1", [("a", {"t": "1"}), ("b", {})]) == [("id1", "s3://b/id1"), ("id2", "s3://b/id2")]
    assert calls == [("1", "a", {"t": "1"}), ("1", "b", {})]

# runs ended in one transaction

@pytest.mark.parametrize("status", ["FINISHED", "FAILED", "KILLED"])
def test_runs_end_as_set_terminated_ends_them(store, status):
    """The same status, an end time of now, nothing else changed; other runs untouched."""
    import time

    from raco_cli.tracking.bulk_metrics import terminate_bulk

    c, exp = store
    ref, *bulk = [c.create_run(exp).info.run_id for _ in range(4)]
    other = c.create_run(exp).info.run_id
    before = int(time.time() * 1000)
    c.set_terminated(ref, status=status)
    terminate_bulk(c, bulk, status)
    after = int(time.time() * 1000)

    def info(run_id):
        i = c.get_run(run_id).info
        return {k: v for k, v in vars(i).items() if k not in ("_run_id", "_run_uuid", "_run_name", "_artifact_uri", "_start_time", "_end_time")}

    for run_id in bulk:
        assert info(run_id) == info(ref)
        assert before <= c.get_run(run_id).info.end_time <= after
    assert c.get_run(other).info.status == "RUNNING" and c.get_run(other).info.end_time is None


def test_ending_a_deleted_run_or_a_bad_status_is_mlflows_error(store):
    """A deleted run sends the batch through set_terminated run by run (as MLflow would end
    them: the live run ends, the deleted one raises); a bad status name is refused first."""
    from mlflow.exceptions import MlflowException

    from raco_cli.tracking.bulk_metrics import terminate_bulk

    c, exp = store
    alive, gone, other = (c.create_run(exp).info.run_id for _ in range(3))
    with pytest.raises(Exception, match="Could not get run status corresponding to string DONE"):
        terminate_bulk(c, [other], "DONE")
    assert c.get_run(other).info.status == "RUNNING"
    c.delete_run(gone)
    with pytest.raises(MlflowException, match="must be in the 'active' state"):
        terminate_bulk(c, [alive, gone], "FINISHED")
    assert c.get_run(alive).info.status == "FINISHED"


def test_ending_runs_on_other_stores_uses_set_terminated():
    from raco_cli.tracking.bulk_metrics import terminate_bulk

    calls = []

    class Client:  # not backed by MLflow's SQL store
        def set_terminated(self, run_id, status):
            calls.append((run_id, status))

    terminate_bulk(Client(), ["a", "b"], "KILLED")
    assert calls == [("a", "KILLED"), ("b", "KILLED")]

def test_a_groups_recorders_look_their_experiment_up_once(tmp_path, monkeypatch):
    """Recorders sharing a client (a group) find the experiment once; each run is in it, and
    a recorder of its own client looks it up itself."""
    from raco_cli.tracking import mlflow_store
    from raco_cli.tracking.mlflow_store import RunRecorder

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    lookups = []
    real = mlflow_store.experiment_id
    monkeypatch.setattr(mlflow_store, "experiment_id", lambda *a: lookups.append(a[1]) or real(*a))
    first = RunRecorder(uri=uri, experiment="e", run_name="one", params={}, tags={})
    group = [RunRecorder(uri=uri, experiment=name, run_name=f"g{i}", params={}, tags={}, client=first.client, buffered=True)
             for i, name in enumerate(["e", "f", "e", "f", "e"])]
    assert lookups == ["e", "e", "f"]
    for r, name in zip(group, ["e", "f", "e", "f", "e"]):
        assert r.experiment_id == first.client.get_experiment_by_name(name).experiment_id
        assert first.client.get_run(r.run_id).info.experiment_id == r.experiment_id


def test_a_groups_runs_created_together_carry_what_one_run_carries(tmp_path):
    """Recorders opened with create=False get their runs from create_runs: the same tags (parent
    sweep run included) and, once flushed, params as a recorder that creates its own run."""
    from raco_cli.tracking.mlflow_store import RunRecorder, create_runs, flush_recorders

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    kw = dict(uri=uri, experiment="e", params={"a": {"b": 1}}, tags={"t": "1"}, parent_sweep_dir=sweep, buffered=True)
    alone = RunRecorder(run_name="r", **kw)
    group = [RunRecorder(run_name="r", client=alone.client, create=False, **kw) for _ in range(3)]
    assert [r.run_id for r in group] == ["", "", ""]
    create_runs([None, *group])
    flush_recorders([alone, *group])
    c = alone.client

    def data(run_id):  # raco.heartbeat: the clock second the recorder opened (the runs may straddle one)
        run = c.get_run(run_id)
        return run.info.status, run.info.experiment_id, run.data.params, {k: v for k, v in run.data.tags.items() if k != "raco.heartbeat"}

    assert len({r.run_id for r in group} | {alone.run_id}) == 4
    assert all(data(r.run_id) == data(alone.run_id) for r in group)
    assert "mlflow.parentRunId" in data(alone.run_id)[3]
    with pytest.raises(ValueError, match="must be buffered"):
        RunRecorder(run_name="r", **{**kw, "buffered": False}, create=False)


def test_artifacts_of_a_groups_runs_go_where_mlflow_puts_them(tmp_path, monkeypatch):
    """A recorder that knows its run's local artifact location (created alone or by
    create_runs) writes a file there without loading the run; MLflow lists and downloads it
    as one it logged itself; a directory still goes through MLflow's call."""
    from raco_cli.tracking.mlflow_store import RunRecorder, create_runs

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    kw = dict(uri=uri, experiment="e", params={}, tags={}, buffered=True)
    alone = RunRecorder(run_name="r", **kw)
    group = [RunRecorder(run_name="r", client=alone.client, create=False, **kw) for _ in range(2)]
    create_runs(group)
    c = alone.client
    f = tmp_path / "summary.json"
    f.write_text('{"a": 1}')
    c.log_artifact(alone.run_id, str(f))  # MLflow's own call: the reference location
    monkeypatch.setattr(c, "log_artifact", lambda *_a: pytest.fail("a file went through MLflow's log_artifact (get_run)"))
    for rec in group:
        rec.log_artifact(f)
    monkeypatch.undo()
    for rec in group:
        assert c.get_run(rec.run_id).info.artifact_uri == rec.artifact_uri
        assert [a.path for a in c.list_artifacts(rec.run_id)] == ["summary.json"]
        (tmp_path / "dl" / rec.run_id).mkdir(parents=True)
        got = c.download_artifacts(rec.run_id, "summary.json", str(tmp_path / "dl" / rec.run_id))
        assert open(got).read() == '{"a": 1}'
    ref = c.get_run(alone.run_id).info.artifact_uri.replace(alone.run_id, "<id>")
    assert all(c.get_run(r.run_id).info.artifact_uri.replace(r.run_id, "<id>") == ref for r in group)
    d = tmp_path / "plots"
    d.mkdir()
    (d / "x.txt").write_text("x")
    group[0].log_artifact(d)
    assert sorted(a.path for a in c.list_artifacts(group[0].run_id)) == ["plots", "summary.json"]


def test_bulk_transactions_on_sqlite_get_the_larger_page_cache(store):
    """The bulk writes' connection has SQLITE_CACHE_KIB of page cache (scripts/bulk_insert_cache.py:
    SQLite's default 2 MB made a group's insert ~1.4 times slower), and MLflow's own settings."""
    from raco_cli.tracking.bulk_metrics import SQLITE_CACHE_KIB, _sql_store, _transaction

    with _transaction(_sql_store(store[0])) as conn:
        assert conn.exec_driver_sql("PRAGMA cache_size").scalar() == -SQLITE_CACHE_KIB
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_a_live_runs_evaluations_reach_the_store_every_few_seconds_and_all_of_them_at_the_end(tmp_path, monkeypatch):
    """An unbuffered recorder (one run) writes its first evaluation at once, then keeps the
    next ones until LIVE_EVERY_S has passed or the run ends; a metric logged directly writes
    the kept evaluations first.  The store then holds exactly the rows of one write per
    evaluation, with their own timestamps and steps."""
    from raco_cli.methods.base import EvalRecord
    from raco_cli.tracking import mlflow_store
    from raco_cli.tracking.mlflow_store import LIVE_EVERY_S, RunRecorder

    clock = [1000.0]
    monkeypatch.setattr(mlflow_store.time, "monotonic", lambda: clock[0])
    rec = RunRecorder(uri=f"sqlite:///{tmp_path / 'm.db'}", experiment="e", run_name="r", params={}, tags={})
    c = rec.client

    def steps_in_store() -> list[int]:
        return [m.step for m in c.get_metric_history(rec.run_id, "test/accuracy")]

    def evaluate(step: int) -> None:
        rec.on_eval(EvalRecord(step=step, metrics={"test": {"accuracy": step / 100}}, lam=[0.5]))

    evaluate(0)
    assert steps_in_store() == [0]  # the first at once: the run shows metrics as soon as it has any
    for step in (5, 10):
        clock[0] += LIVE_EVERY_S / 4
        evaluate(step)
    assert steps_in_store() == [0]
    clock[0] += LIVE_EVERY_S
    evaluate(15)
    assert steps_in_store() == [0, 5, 10, 15]
    evaluate(20)
    rec.log_metrics({"final/accuracy": 0.2}, step=20)  # the kept evaluation goes first
    assert steps_in_store() == [0, 5, 10, 15, 20]
    evaluate(25)
    rec.finish("FINISHED")
    history = c.get_metric_history(rec.run_id, "test/accuracy")
    assert [(m.step, m.value) for m in history] == [(s, s / 100) for s in range(0, 30, 5)]
    assert [m.step for m in c.get_metric_history(rec.run_id, "dual/lambda_max")] == list(range(0, 30, 5))
    assert c.get_run(rec.run_id).data.metrics["final/accuracy"] == 0.2
