"""Concurrent sweeps: 8 parallel jobs (joblib) writing to one SQLite store, and to an MLflow
tracking server on 127.0.0.1, lose no run and no metric."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

JOBS = 8


def _sweep(tmp_path: Path, uri: str, *, grouped: bool = False) -> subprocess.CompletedProcess:
    # one process per run (grouping would make these 8 runs one batched job) and curves drawn, as in
    # the sweeps this test was written for: concurrent writers of every kind of record; grouped: four
    # group jobs of two runs at once, each writing its runs' histories in bulk (tracking/bulk_metrics.py)
    layout = ["hydra.sweeper.group=true", "hydra.sweeper.group_max_runs=2"] if grouped else ["hydra.sweeper.group=false", "tracking.curves=true"]
    return subprocess.run(
        [sys.executable, "-m", "raco_cli", "train", "--multirun", "dataset=synthetic", f"seed=range(0,{JOBS})",
         "method.batch_size=200", "method.max_steps=20", "method.eval_every=5", "hydra/launcher=joblib",
         "constraint.confidence=null",  # the synthetic set cannot support the default margin at gamma 0.05
         f"hydra.launcher.n_jobs={JOBS}", f"tracking.uri={uri}", "tracking.experiment=conc",
         f"hydra.sweep.dir={tmp_path / 'sweep'}", *layout],
        cwd=tmp_path, capture_output=True, text=True, timeout=1200,
    )


def _check(tmp_path: Path, uri: str, *, curves: bool = True) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("conc")
    runs = client.search_runs([exp.experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    parents = [r for r in runs if r.data.tags.get("raco.role") == "sweep"]
    assert len(children) == JOBS and len(parents) == 1
    assert all(r.info.status == "FINISHED" for r in runs)  # the parent is closed too
    assert sorted(int(r.data.params["seed"]) for r in children) == list(range(JOBS))
    for r in children:
        summary = json.loads((Path(r.data.tags["raco.run_dir"]) / "summary.json").read_text())
        # privacy.scope=model (the default) records the released split and the test split
        history = client.get_metric_history(r.info.run_id, "test/accuracy")
        # evaluations at steps 0, 5, ..., 20: every one arrived, once
        assert sorted(m.step for m in history) == [0, 5, 10, 15, 20]
        assert r.data.metrics["final/test/accuracy"] == pytest.approx(summary["metrics"]["test"]["accuracy"])
        assert {"summary.json", "config.yaml", *(["curves.png"] if curves else [])} <= {a.path for a in client.list_artifacts(r.info.run_id)}


def test_eight_parallel_jobs_into_one_sqlite_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res = _sweep(tmp_path, uri)
    assert res.returncode == 0, res.stderr[-3000:]
    _check(tmp_path, uri)


def test_four_parallel_group_jobs_into_one_sqlite_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res = _sweep(tmp_path, uri, grouped=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "8 runs as 4 launcher jobs" in res.stderr + res.stdout
    _check(tmp_path, uri, curves=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_eight_parallel_jobs_into_a_tracking_server(tmp_path):
    port = _free_port()
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    server = subprocess.Popen(
        [str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "server-artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "2"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("mlflow server did not start")
        res = _sweep(tmp_path, uri)
        assert res.returncode == 0, res.stderr[-3000:]
        _check(tmp_path, uri)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
