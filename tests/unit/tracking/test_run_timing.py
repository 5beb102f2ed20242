"""No process timing in the records of a run without full records (issue 59): a private
``privacy.scope=model`` run's MLflow tags, params, metrics and run start/end times tell nothing
of how long it (or a private search: its secret K) took, and stale-run detection still works
through the run's lock file outside the records (raco_cli/tracking/mlflow_store.py RunLock)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("mlflow")

from raco_cli.tracking import mlflow_store  # noqa: E402
from raco_cli.tracking.mlflow_store import RunRecorder, is_stale, lock_dir, mark_stale_runs  # noqa: E402

TIMING = ("raco.pid_start", "raco.heartbeat", "raco.pid", "raco.host")


def _uri(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _all_records(c, run_id):
    run = c.get_run(run_id)
    history = [m for k in run.data.metrics for m in c.get_metric_history(run_id, k)]
    return run, history


def _untimed(run, history, day):
    assert not set(TIMING) & set(run.data.tags), run.data.tags
    assert run.data.tags["raco.timed"] == "false"
    assert run.info.start_time == run.info.end_time == day
    assert {m.timestamp for m in history} <= {day}
    names = [n for n in (*run.data.params, *run.data.metrics, *run.data.tags) if n != "raco.timed"]
    assert not [n for n in names if any(w in n.lower() for w in ("time", "duration", "elapsed", "wall", "_s"))], names


def test_an_untimed_run_records_no_process_timing_and_starts_when_it_ends(tmp_path):
    uri = _uri(tmp_path)
    rec = RunRecorder(uri=uri, experiment="e", run_name="r", params={"a": 1}, tags={"t": "1"}, timed=False)
    lock = lock_dir(uri) / f"{rec.run_id}.lock"
    assert lock.exists() and "mlartifacts" not in str(lock)  # beside the store, outside its artifacts
    rec.heartbeat()  # refreshes the lock only
    rec.log_metrics({"x": 1.0}, step=1)
    time.sleep(0.01)
    rec.finish("FINISHED")
    assert not lock.exists()  # nothing of its liveness outlives the run
    run, history = _all_records(rec.client, rec.run_id)
    _untimed(run, history, mlflow_store.public_day_ms())
    assert run.info.status == "FINISHED"


def test_a_groups_untimed_runs_and_their_sweep_parent_carry_no_timing(tmp_path):
    uri = _uri(tmp_path)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    first = RunRecorder(uri=uri, experiment="e", run_name="one", params={}, tags={}, timed=False, parent_sweep_dir=sweep)
    group = [RunRecorder(uri=uri, experiment="e", run_name=f"g{i}", params={"i": i}, tags={}, client=first.client, buffered=True,
                         create=False, timed=False, parent_sweep_dir=sweep) for i in range(2)]
    mlflow_store.create_runs(group)
    for rec in group:
        rec.log_metrics({"x": 2.0}, step=3)
    mlflow_store.finish_recorders([first, *group], "FINISHED")
    mlflow_store.close_sweep(uri, sweep)
    day = mlflow_store.public_day_ms()
    for rec in (first, *group):
        _untimed(*_all_records(first.client, rec.run_id), day)
    parent = first.client.get_run((sweep / mlflow_store.PARENT_FILE).read_text().strip())
    assert parent.info.status == "FINISHED" and parent.info.start_time == parent.info.end_time == day
    assert not set(TIMING) & set(parent.data.tags)
    assert not list(lock_dir(uri).glob("*.lock"))


def test_a_timed_run_keeps_its_process_tags(tmp_path):
    """scope=paper (full records) keeps today's process tags and clock times."""
    rec = RunRecorder(uri=_uri(tmp_path), experiment="e", run_name="r", params={}, tags={})
    rec.finish("FINISHED")
    run = rec.client.get_run(rec.run_id)
    assert {"raco.pid_start", "raco.heartbeat"} <= set(run.data.tags)
    assert run.info.start_time > mlflow_store.public_day_ms()


# stale detection through the lock


def _dead_lock(path):
    """A lock written by a process that has exited (its flock went with it)."""
    code = ("import sys; from pathlib import Path; from raco_cli.tracking.mlflow_store import RunLock, process_identity; "
            "RunLock(Path(sys.argv[1]), process_identity())")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env={**os.environ}, timeout=120)


def test_a_dead_processs_lock_is_stale_and_a_live_ones_is_not(tmp_path):
    dead = tmp_path / "dead.lock"
    _dead_lock(dead)
    assert json.loads(dead.read_text())["host"] == socket.gethostname()
    assert "is gone" in is_stale({}, lock=dead)
    live = mlflow_store.RunLock(tmp_path / "live.lock", mlflow_store.process_identity())
    assert is_stale({}, lock=tmp_path / "live.lock") is None  # held (this process)
    live.release()
    assert is_stale({}, lock=tmp_path / "live.lock") is None  # ended: no lock, no tags: not stale


def test_another_hosts_lock_is_stale_without_a_heartbeat(tmp_path):
    path = tmp_path / "other.lock"
    mlflow_store.RunLock(path, {"raco.host": "elsewhere", "raco.pid": "1", "raco.pid_start": "7"}, hold=False)
    assert is_stale({}, lock=path, stale_after_s=900) is None
    old = time.time() - 1000
    os.utime(path, (old, old))
    assert "no heartbeat from elsewhere" in is_stale({}, lock=path, stale_after_s=900)


def test_a_killed_untimed_run_is_marked_stale_by_the_next_and_a_live_one_is_not(tmp_path):
    uri = _uri(tmp_path)
    live = RunRecorder(uri=uri, experiment="e", run_name="live", params={}, tags={}, timed=False)
    c = live.client
    exp = live.experiment_id
    killed = c.create_run(exp, tags={"raco.timed": "false"}, start_time=mlflow_store.public_day_ms()).info.run_id
    _dead_lock(lock_dir(uri) / f"{killed}.lock")
    marked = mark_stale_runs(c, exp, locks=lock_dir(uri))
    assert [m[0] for m in marked] == [killed]
    run = c.get_run(killed)
    assert run.info.status == "FAILED" and run.info.end_time == run.info.start_time  # no duration either
    assert not (lock_dir(uri) / f"{killed}.lock").exists()
    assert c.get_run(live.run_id).info.status == "RUNNING"
    live.finish("FINISHED")


def test_an_untimed_runs_logged_model_carries_the_runs_public_time(tmp_path):
    """A dataset=table run logs its model at its end: MLflow would stamp it with that time."""
    rec = RunRecorder(uri=_uri(tmp_path), experiment="e", run_name="r", params={}, tags={}, timed=False)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "MLmodel").write_text("flavors: {}\n")
    uri = rec.log_model(model_dir)
    rec.finish("FINISHED")
    model = rec.client.get_logged_model(uri.split("/")[-1])
    assert model.creation_timestamp == model.last_updated_timestamp == mlflow_store.public_day_ms()
