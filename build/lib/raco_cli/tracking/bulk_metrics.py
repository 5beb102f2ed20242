"""The evaluation histories, params and tags of many runs written in a few store transactions.

A sweep group (:mod:`raco_cli.run.group`) ends with every run's buffered metrics to write:
for a 160-run Adult group at 100 steps, ~133 000 rows.  MLflow's ``log_batch`` builds an ORM
object per row and keeps ``latest_metrics`` up to date key by key, ~0.4 ms a row on SQLite
(profiled with 195 000 rows: 72 s of the group's 166 s, against 39 s of training).  Here the
same rows go into the same tables — MLflow's own table objects, so the schema follows the
installed MLflow — by one ``executemany`` per table and transaction, with MLflow's validation,
NaN/inf sanitising and "latest = greatest (step, timestamp, value)" rule applied the same way
(tests/unit/tracking/test_bulk_metrics.py compares both paths row for row).

The group's params (when its runs open) and final tags (when they close) go the same way
(:func:`log_params_tags_bulk`): one transaction for all runs instead of one or more per run,
and so do the runs' beginnings and ends (:func:`create_runs_bulk`, :func:`terminate_bulk`:
MLflow's ``create_run`` and ``set_terminated`` also reload the run, its params, tags and
latest metrics, to return it; ``set_terminated`` spends ~70 % of its time there).

Only MLflow's SQL store takes this path; any other store, and any batch MLflow's own path
would treat specially (a row already stored, a run that is deleted), goes through
``log_batch`` run by run, whose checks and de-duplication then apply.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from raco_cli.tracking.retry import retrying

# rows per transaction: runs are kept whole; a SQLite writer holds the database lock for
# the whole transaction, and parallel group jobs wait for it (busy timeout 20 s)
ROWS_PER_TRANSACTION = 50_000
SQLITE_CACHE_KIB = 131_072  # page cache of a bulk write's SQLite connection
_LOG_BATCH_LIMIT = 1000  # MLflow's metrics per log_batch request
_PARAMS_PER_LOG_BATCH = 100  # MLflow's params (and tags) per log_batch request
_RUN_NAME_TAG = "mlflow.runName"
_PLAIN = (int, float)  # exact types: bool is an int subclass MLflow refuses as a value


class _Fallback(Exception):
    """The batch needs MLflow's own per-run path."""


def log_metrics_bulk(client: Any, metrics_by_run: Mapping[str, Sequence[Any]]) -> None:
    """Log ``{run_id: [metric, ...]}`` as ``client.log_batch`` would, run by run; a metric is an
    ``mlflow.entities.Metric`` or a plain ``(key, value, timestamp, step)`` tuple (what a
    buffered recorder keeps: building an MLflow entity per row cost ~3 s of a 160-run group)."""
    todo = {run_id: list(ms) for run_id, ms in metrics_by_run.items() if ms}
    store = _sql_store(client)
    if store is None:
        for run_id, ms in todo.items():
            _per_run(client, run_id, ms)
        return
    for chunk in _chunks(todo):
        try:
            retrying(_write, store, chunk)
        except _Fallback:
            for run_id, ms in chunk.items():
                _per_run(client, run_id, ms)


def _entities(metrics: Sequence[Any]) -> list[Any]:
    """The metrics as ``mlflow.entities.Metric`` (plain tuples converted) for MLflow's own path."""
    from mlflow.entities import Metric

    return [Metric(*m) if type(m) is tuple else m for m in metrics]


def _per_run(client: Any, run_id: str, metrics: Sequence[Any]) -> None:
    metrics = _entities(metrics)
    for start in range(0, len(metrics), _LOG_BATCH_LIMIT):
        retrying(client.log_batch, run_id, metrics=metrics[start : start + _LOG_BATCH_LIMIT])


def _sql_store(client: Any) -> Any:
    """The client's SqlAlchemyStore, or None (file, REST or any other store)."""
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    except ImportError:  # pragma: no cover - mlflow without SQL support
        return None
    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    return store if isinstance(store, SqlAlchemyStore) else None


def _chunks(todo: Mapping[str, list[Any]]) -> list[dict[str, list[Any]]]:
    out: list[dict[str, list[Any]]] = [{}]
    rows = 0
    for run_id, ms in todo.items():
        if rows and rows + len(ms) > ROWS_PER_TRANSACTION:
            out.append({})
            rows = 0
        out[-1][run_id] = ms
        rows += len(ms)
    return [c for c in out if c]


#: a metric row's columns, in the order of the tuples :func:`_rows` builds
_METRIC_COLUMNS = ("key", "value", "timestamp", "run_uuid", "step", "is_nan")


def _rows(store: Any, run_id: str, metrics: Sequence[Any]) -> list[tuple[Any, ...]]:
    """MLflow's checks and sanitising (``_log_metrics_once``): each metric validated, exact
    duplicates within the batch dropped, NaN stored as 0 with ``is_nan``, +-inf as +-max float.
    One tuple per row, columns :data:`_METRIC_COLUMNS`."""
    from mlflow.utils.validation import _validate_metric

    rows, seen, valid = [], set(), set()
    sanitize = store.sanitize_metric_value
    for m in metrics:
        # MLflow's check of a row whose value, timestamp and step are plain ints/floats (timestamp
        # >= 0) depends on its key alone: checked once per key (it was two thirds of this loop);
        # any other row is checked in full.  A plain tuple is a Metric without a model or dataset:
        # its duplicates are the equal tuples
        key, value, timestamp, step = m if type(m) is tuple else (m.key, m.value, m.timestamp, m.step)
        plain = type(value) in _PLAIN and type(timestamp) in _PLAIN and type(step) in _PLAIN and timestamp >= 0
        if not (plain and key in valid):
            _validate_metric(key, value, timestamp, step)
            if plain:
                valid.add(key)
        if m in seen:
            continue
        seen.add(m)
        is_nan, value = sanitize(value)
        rows.append((key, value, timestamp, run_id, step, is_nan))
    return rows


def _order(row: tuple[Any, ...]) -> tuple[Any, Any, Any]:
    """MLflow's rule for latest_metrics: the latest row has the greatest (step, timestamp, value)."""
    return row[4], row[2], row[1]


def _insert_rows(conn: Any, table: Any, rows: list[tuple[Any, ...]]) -> None:
    """``INSERT`` of ``rows`` (tuples, columns :data:`_METRIC_COLUMNS`) into ``table``.  On
    SQLite the driver's ``executemany`` takes the tuples as they are (the SQL expression's
    per-row parameter processing was a third of a bulk write: 488 320 rows of a 160-run
    group at T = 400); other databases go through SQLAlchemy's insert.  Integrity errors surface as
    SQLAlchemy's either way."""
    import sqlalchemy as sa

    if not rows:
        return
    if conn.dialect.name == "sqlite":
        quote = conn.dialect.identifier_preparer.quote
        columns = ", ".join(quote(c) for c in _METRIC_COLUMNS)
        marks = ", ".join("?" for _ in _METRIC_COLUMNS)
        conn.exec_driver_sql(f"INSERT INTO {quote(table.name)} ({columns}) VALUES ({marks})", rows)
    else:
        conn.execute(sa.insert(table), [dict(zip(_METRIC_COLUMNS, r)) for r in rows])


def _write(store: Any, chunk: Mapping[str, Sequence[Any]]) -> None:
    """One transaction: every row of ``chunk`` into ``metrics`` and ``latest_metrics`` updated."""
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric

    metrics, latest_metrics = SqlMetric.__table__, SqlLatestMetric.__table__
    rows = [r for run_id, ms in chunk.items() for r in _rows(store, run_id, ms)]
    latest: dict[tuple[str, str], tuple[Any, ...]] = {}
    for row in rows:
        k = (row[3], row[0])  # (run_uuid, key)
        if k not in latest or _order(row) > _order(latest[k]):
            latest[k] = row
    run_ids = list(chunk)
    with _active_runs_transaction(store, run_ids) as conn:
        cols = (latest_metrics.c.run_uuid, latest_metrics.c.key, latest_metrics.c.step, latest_metrics.c.timestamp, latest_metrics.c.value)
        stored = {
            (run_uuid, key): (step, ts, value)
            for run_uuid, key, step, ts, value in conn.execute(sa.select(*cols).where(latest_metrics.c.run_uuid.in_(run_ids))).all()
        }
        try:
            _insert_rows(conn, metrics, rows)
        except sa.exc.IntegrityError:
            raise _Fallback from None  # a row already stored: MLflow's path skips it
        new = [dict(zip(_METRIC_COLUMNS, row)) for k, row in latest.items() if k not in stored]
        if new:
            conn.execute(sa.insert(latest_metrics), new)
        for r in (dict(zip(_METRIC_COLUMNS, row)) for k, row in latest.items() if k in stored and _order(row) > stored[k]):
            conn.execute(
                sa.update(latest_metrics)
                .where(latest_metrics.c.run_uuid == r["run_uuid"], latest_metrics.c.key == r["key"])
                .values(value=r["value"], step=r["step"], timestamp=r["timestamp"], is_nan=r["is_nan"])
            )


def log_params_tags_bulk(client: Any, batches: Mapping[str, tuple[Sequence[Any], Sequence[Any]]]) -> None:
    """Log ``{run_id: ([mlflow.entities.Param], [mlflow.entities.RunTag])}`` as ``client.log_batch``
    would, run by run: params are immutable (a different value for a logged key is MLflow's
    error), a tag replaces the run's tag of the same key.  A group opens its runs' params and
    closes their final tags this way: one transaction instead of one (or more) per run."""
    todo = {run_id: (list(p), list(t)) for run_id, (p, t) in batches.items() if p or t}
    if not todo:
        return
    store = _sql_store(client)
    try:
        if store is None or any(tag.key == _RUN_NAME_TAG for _, tags in todo.values() for tag in tags):
            raise _Fallback  # mlflow.runName also renames the run: MLflow's path
        retrying(_write_params_tags, store, todo)
    except _Fallback:
        for run_id, (params, tags) in todo.items():
            for start in range(0, max(len(params), len(tags)), _PARAMS_PER_LOG_BATCH):
                retrying(client.log_batch, run_id, params=params[start : start + _PARAMS_PER_LOG_BATCH],
                         tags=tags[start : start + _PARAMS_PER_LOG_BATCH])


def _write_params_tags(store: Any, todo: Mapping[str, tuple[list[Any], list[Any]]]) -> None:
    """One transaction: MLflow's validation of each run's batch (``SqlAlchemyStore.log_batch``),
    its params inserted (a key already logged: MLflow's path decides), its tags upserted."""
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels.models import SqlParam, SqlTag
    from mlflow.utils.validation import (
        _validate_batch_log_data,
        _validate_batch_log_limits,
        _validate_param_keys_unique,
    )

    param_rows: list[dict[str, Any]] = []
    tag_rows: dict[str, dict[str, dict[str, Any]]] = {}  # run -> key -> row
    for run_id, (params, tags) in todo.items():
        _, params, tags = _validate_batch_log_data([], params, tags)
        for start in range(0, max(len(params), len(tags)), _PARAMS_PER_LOG_BATCH):  # the requests MLflow's path makes
            _validate_batch_log_limits([], params[start : start + _PARAMS_PER_LOG_BATCH], tags[start : start + _PARAMS_PER_LOG_BATCH])
        _validate_param_keys_unique(params)
        param_rows += [{"run_uuid": run_id, "key": p.key, "value": p.value} for p in params]
        for t in tags:  # the last value of a key wins, as in MLflow's _set_tags
            tag_rows.setdefault(run_id, {})[t.key] = {"run_uuid": run_id, "key": t.key, "value": t.value}
    params_t, tags_t = SqlParam.__table__, SqlTag.__table__
    with _active_runs_transaction(store, list(todo)) as conn:
        if param_rows:
            try:
                conn.execute(sa.insert(params_t), param_rows)
            except sa.exc.IntegrityError:
                raise _Fallback from None  # a key already logged: equal is fine, different MLflow's error
        for run_id, rows in tag_rows.items():  # upsert: the keys being set are replaced
            conn.execute(sa.delete(tags_t).where(tags_t.c.run_uuid == run_id, tags_t.c.key.in_(list(rows))))
        if tag_rows:
            conn.execute(sa.insert(tags_t), [row for rows in tag_rows.values() for row in rows.values()])


def create_runs_bulk(client: Any, experiment_id: str, runs: Sequence[tuple[str, Mapping[str, str]]], *,
                     start_times: Sequence[int | None] | None = None) -> list[tuple[str, str]]:
    """``(info.run_id, info.artifact_uri)`` of ``client.create_run(experiment_id, run_name=name,
    tags=tags)`` for every ``(name, tags)``: the rows ``SqlAlchemyStore.create_run`` writes (a
    RUNNING run named ``name``, its ``mlflow.runName`` tag, user from ``mlflow.user``, start time
    now or run i's ``start_times[i]`` when not None (a run without process timing), artifacts under
    the experiment's location), all in one transaction.  Any other store, or a name that differs
    from its ``mlflow.runName`` tag (MLflow's error), goes through ``create_run``."""
    starts = list(start_times) if start_times is not None else [None] * len(runs)
    store = _sql_store(client)
    try:
        if store is None or any(tags.get(_RUN_NAME_TAG, name) != name for name, tags in runs):
            raise _Fallback
        return list(retrying(_create_runs, store, experiment_id, runs, starts))
    except _Fallback:
        infos = [retrying(client.create_run, experiment_id, run_name=name, tags=dict(tags),
                          **({} if start is None else {"start_time": start})).info
                 for (name, tags), start in zip(runs, starts)]
        return [(info.run_id, info.artifact_uri) for info in infos]


def _create_runs(store: Any, experiment_id: str, runs: Sequence[tuple[str, Mapping[str, str]]],
                 starts: Sequence[int | None]) -> list[tuple[str, str]]:
    import uuid

    import sqlalchemy as sa
    from mlflow.entities import LifecycleStage, RunStatus, SourceType
    from mlflow.store.tracking.dbmodels.models import SqlRun, SqlTag
    from mlflow.utils.mlflow_tags import MLFLOW_USER
    from mlflow.utils.time import get_current_time_millis
    from mlflow.utils.uri import append_to_uri_path

    experiment = store.get_experiment(experiment_id)
    store._check_experiment_is_active(experiment)  # MLflow's error for a deleted experiment
    start = get_current_time_millis()
    run_rows, tag_rows = [], []
    for (name, tags), fixed in zip(runs, starts):
        run_id = uuid.uuid4().hex
        run_rows.append({
            "run_uuid": run_id, "name": name, "source_type": SourceType.to_string(SourceType.UNKNOWN), "source_name": "",
            "entry_point_name": "", "user_id": tags.get(MLFLOW_USER, "unknown"), "status": RunStatus.to_string(RunStatus.RUNNING),
            "start_time": start if fixed is None else fixed, "end_time": None, "deleted_time": None, "source_version": "",
            "lifecycle_stage": LifecycleStage.ACTIVE,
            "artifact_uri": append_to_uri_path(experiment.artifact_location, run_id, store.ARTIFACTS_FOLDER_NAME),
            "experiment_id": int(experiment_id),
        })
        tag_rows += [{"run_uuid": run_id, "key": k, "value": v} for k, v in {**tags, _RUN_NAME_TAG: name}.items()]
    with _transaction(store) as conn:
        conn.execute(sa.insert(SqlRun.__table__), run_rows)
        if tag_rows:
            conn.execute(sa.insert(SqlTag.__table__), tag_rows)
    return [(row["run_uuid"], row["artifact_uri"]) for row in run_rows]


def terminate_bulk(client: Any, run_ids: Sequence[str], status: str, *, end_times: Sequence[int | None] | None = None) -> None:
    """``client.set_terminated(run_id, status=status)`` for every run: the same status and end
    time (now, in ms; run i's ``end_times[i]`` when not None: a run without process timing ends
    at its public start) in one transaction on MLflow's SQL store; any other store, or a run
    that is missing or deleted (MLflow's error), goes through ``set_terminated`` run by run."""
    from mlflow.entities import RunStatus
    from mlflow.utils.time import get_current_time_millis

    status = RunStatus.to_string(RunStatus.from_string(status))  # MLflow's check of the name
    ends = list(end_times) if end_times is not None else [None] * len(run_ids)
    store = _sql_store(client)
    try:
        if store is None or not run_ids:
            raise _Fallback
        now = get_current_time_millis()
        retrying(_terminate, store, list(run_ids), status, [now if e is None else e for e in ends])
    except _Fallback:
        for run_id, end in zip(run_ids, ends):
            retrying(client.set_terminated, run_id, status=status, **({} if end is None else {"end_time": end}))


def _terminate(store: Any, run_ids: list[str], status: str, end_times: list[int]) -> None:
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels.models import SqlRun

    runs = SqlRun.__table__
    by_end: dict[int, list[str]] = {}
    for run_id, end in zip(run_ids, end_times):
        by_end.setdefault(end, []).append(run_id)
    with _active_runs_transaction(store, run_ids) as conn:
        for end, ids in by_end.items():
            conn.execute(sa.update(runs).where(runs.c.run_uuid.in_(ids)).values(status=status, end_time=end))


@contextmanager
def _transaction(store: Any) -> Iterator[Any]:
    """A connection in one transaction (committed at the end, rolled back on any exception)
    with MLflow's SQLite session settings."""
    import sqlalchemy as sa

    with store.engine.begin() as conn:
        if store.engine.dialect.name == "sqlite":  # what MLflow's sessions set on SQLite
            conn.execute(sa.text("PRAGMA foreign_keys = ON"))
            conn.execute(sa.text("PRAGMA busy_timeout = 20000"))
            # a group's rows go to ~350 places of the metrics indexes (37 keys per evaluation,
            # and 160 runs in each of two run-first indexes): more pages than SQLite's default
            # 2 MB cache.  128 MiB cut the insert of a 160-run group's 479 520 rows into a store
            # of four groups to 0.70 of the time (scripts/bulk_insert_cache.py); SQLite
            # allocates the pages only as it uses them
            conn.execute(sa.text(f"PRAGMA cache_size = -{SQLITE_CACHE_KIB}"))
        yield conn


@contextmanager
def _active_runs_transaction(store: Any, run_ids: Sequence[str]) -> Iterator[Any]:
    """:func:`_transaction`, after checking every run is active (a missing or deleted run:
    MLflow's per-run path, which raises its own error)."""
    import sqlalchemy as sa
    from mlflow.entities import LifecycleStage
    from mlflow.store.tracking.dbmodels.models import SqlRun

    runs = SqlRun.__table__
    with _transaction(store) as conn:
        stages = dict(conn.execute(sa.select(runs.c.run_uuid, runs.c.lifecycle_stage).where(runs.c.run_uuid.in_(list(run_ids)))).all())
        if any(stages.get(run_id) != LifecycleStage.ACTIVE for run_id in run_ids):
            raise _Fallback
        yield conn


def untime_logged_model(client: Any, model_id: str, when: int) -> None:
    """Set a logged model's creation and update times (MLflow: now) to ``when``, on MLflow's SQL
    store (a run without process timing: its model would time the run's end); other stores keep
    MLflow's."""
    store = _sql_store(client)
    if store is None:
        return
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels.models import SqlLoggedModel

    models = SqlLoggedModel.__table__

    def update() -> None:
        with _transaction(store) as conn:
            conn.execute(sa.update(models).where(models.c.model_id == model_id)
                         .values(creation_timestamp_ms=when, last_updated_timestamp_ms=when))

    retrying(update)
