"""`hydra/launcher=slurm` against a real scheduler (`make test-slurm` starts a one-node cluster).

Marked ``slurm``: not in `make test`; skipped when no cluster answers ``sinfo`` (SLURM_CONF or
the system's configuration).  Tiny Parkinsons sweeps, one CPU and 1 GB per task, MLflow in a
temporary SQLite store; every command is run as a user would, in a subprocess.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _cluster_answers() -> str | None:
    """Why the slurm tests cannot run here, or None when a cluster answers."""
    if not shutil.which("sbatch"):
        return "no SLURM client (sbatch) on PATH; `make test-slurm` starts a one-node cluster"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo did not answer ({exc}); `make test-slurm` starts a one-node cluster"
    if out.returncode or not out.stdout.strip():
        return "no SLURM cluster answers sinfo; `make test-slurm` starts a one-node cluster"
    return None


def _parkinsons_missing() -> str | None:
    roots = [os.environ.get("RACO_DATA_MIRROR", ""), str(Path(__file__).resolve().parents[2] / "datasets")]
    if any((Path(r) / "parkinsons" / f"parkinsons_updrs.data{gz}").exists() for r in roots if r for gz in ("", ".gz")):
        return None
    return "needs the Parkinsons file (RACO_DATA_MIRROR, or make data DATASET=parkinsons)"


_WHY_NOT = _cluster_answers() or _parkinsons_missing()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")]

# one CPU and 1 GB per task: two tasks run at once on the 2-CPU test node
TASK = ["hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=20"]


def raco(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raco_cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def runs(db: Path, experiment: str = "raco") -> tuple[list, list]:
    """(job runs, sweep parent runs) of an experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    found = [] if exp is None else client.search_runs([exp.experiment_id])
    return ([r for r in found if r.data.tags.get("raco.role") != "sweep"],
            [r for r in found if r.data.tags.get("raco.role") == "sweep"])


def assert_quiet_polling(stderr: str) -> None:
    """No per-poll sacct noise: at most one warning for the whole sweep (none with accounting)."""
    assert "Bypassing sacct error" not in stderr
    assert stderr.count("SLURM accounting is unavailable") <= 1


def test_small_sweep_finishes_every_job_and_closes_the_parent(tmp_path):
    db = tmp_path / "mlflow.db"
    res = raco("train", "--multirun", *TASK, "experiment=parkinsons_dp", "seed=range(0,3)", "method.max_steps=10",
               f"tracking.uri=sqlite:///{db}", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert_quiet_polling(res.stderr)
    jobs, parents = runs(db)
    assert sorted(r.data.params["seed"] for r in jobs) == ["0", "1", "2"]
    assert all(r.info.status == "FINISHED" for r in jobs)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    # the parent belongs to the launching process, so it never looked stale while tasks ran
    assert "raco.stale_reason" not in parents[0].data.tags
    assert {r.data.tags["mlflow.parentRunId"] for r in jobs} == {parents[0].info.run_id}
    assert sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/summary.json")) == ["0", "1", "2"]


def test_failed_job_is_recorded_and_counted_while_the_others_finish(tmp_path):
    db = tmp_path / "mlflow.db"
    # eps=0.001 is unreachable (one step of this mechanism already spends more): that job fails
    res = raco("train", "--multirun", *TASK, "experiment=parkinsons_dp", "eps=1,0.001", "method.max_steps=10",
               f"tracking.uri=sqlite:///{db}", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        "error: 1 of 2 sweep jobs failed (recorded FAILED in MLflow; their errors are above). "
        "Run the same command again to retry only the unfinished jobs.")
    assert_quiet_polling(res.stderr)
    jobs, parents = runs(db)
    assert {r.data.params["eps"]: r.info.status for r in jobs} == {"1": "FINISHED", "0.001": "FAILED"}
    failed = next(r for r in jobs if r.info.status == "FAILED")
    assert failed.data.tags["raco.error"].startswith("PrivacyBudgetError: Cannot reach eps=0.001")
    assert len(parents) == 1 and parents[0].info.status == "FAILED"


def start_and_cancel_task_0(args: list[str], cwd: Path) -> tuple[str, str, int]:
    """Run the sweep ``args`` and ``scancel`` its first task once both runs train; (task id,
    stderr, exit code)."""
    proc = subprocess.Popen([sys.executable, "-m", "raco_cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        task0 = None
        while time.monotonic() < deadline and proc.poll() is None and task0 is None:
            # both runs' MLflow runs exist: they are training (so no later task reaps the
            # cancelled run as stale first: the launcher itself records it FAILED)
            if len(list(cwd.glob("outputs/multiruns/*/*/*/.mlflow_run_id"))) == 2:
                # an array's task 0 is <job>_0 (its folder <job> holds the array's submission);
                # a lone task (one launcher job) is the job itself
                names = [p.name for p in cwd.glob("outputs/multiruns/*/*/.submitit/*") if p.is_dir()]
                task0 = next((n for n in names if n.endswith("_0")), None) or next((n for n in names if n.isdigit()), None)
            time.sleep(0.5)
        assert task0 is not None, "the runs never started training"
        subprocess.run(["scancel", task0], check=True, timeout=60)
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_quiet_polling(err)
    return task0, err, proc.returncode


def scancel_args(db: Path, *extra: str) -> list[str]:
    # enough steps that the runs are still training when scancel's SIGKILL comes (KillWait=5 s)
    return ["train", "--multirun", *TASK, *extra, "experiment=parkinsons_dp", "eps=8", "seed=0,1", "method.max_steps=400",
            f"tracking.uri=sqlite:///{db}"]


def test_scancel_of_a_running_task_then_the_same_command_runs_only_what_is_missing(tmp_path):
    """One task per run: cancel task 0 of the 2-task array while it trains; the sweep reports it
    failed, the other task finishes; the same command again (a new sweep directory) runs only
    seed 0."""
    db = tmp_path / "mlflow.db"
    args = scancel_args(db, "hydra.sweeper.group=false")
    task0, err, code = start_and_cancel_task_0(args, tmp_path)
    assert code == 1, err
    assert re.search(rf"^error: job 0 \(.*seed=0.*\): SLURM task {task0} ended CANCELLED without a result", err, re.M), err
    assert err.strip().splitlines()[-1].startswith("error: 1 of 2 sweep jobs failed")
    jobs, parents = runs(db)
    assert {r.data.params["seed"]: r.info.status for r in jobs} == {"0": "FAILED", "1": "FINISHED"}
    failed = next(r for r in jobs if r.info.status == "FAILED")
    assert failed.data.tags["raco.error"].startswith(f"LostJobError: SLURM task {task0} ended CANCELLED without a result")
    assert len(parents) == 1 and parents[0].info.status == "FAILED"

    res = raco(*args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "sweep: 2 jobs, 1 already FINISHED in MLflow skipped" in res.stdout + res.stderr
    assert ", 1 to run" in res.stdout + res.stderr
    jobs, parents = runs(db)
    done = sorted(r.data.params["seed"] for r in jobs if r.info.status == "FINISHED")
    assert done == ["0", "1"] and len(jobs) == 3  # seed 1 ran once; seed 0 failed once, then finished
    assert sorted(p.info.status for p in parents) == ["FAILED", "FINISHED"]
    assert not [r for r in jobs if r.info.status == "RUNNING"]


def test_scancel_of_a_group_task_fails_each_of_its_runs_then_the_same_command_runs_them(tmp_path):
    """Grouped (the default: both seeds are one task training them together): cancelling that
    task marks both runs FAILED and counts both; the same command again runs both."""
    db = tmp_path / "mlflow.db"
    args = scancel_args(db)
    task0, err, code = start_and_cancel_task_0(args, tmp_path)
    assert code == 1, err
    assert list(tmp_path.glob("outputs/multiruns/*/*/.groups/0.json")), "the two seeds were not one group task"
    assert re.search(rf"^error: group job 0 \(runs 0, 1 of the sweep, trained in one task\): SLURM task {task0} ended CANCELLED without a result", err, re.M), err
    assert err.strip().splitlines()[-1].startswith("error: 2 of 2 sweep jobs failed")
    jobs, parents = runs(db)
    assert {r.data.params["seed"]: r.info.status for r in jobs} == {"0": "FAILED", "1": "FAILED"}
    assert all(r.data.tags["raco.error"].startswith(f"LostJobError: SLURM task {task0} ended CANCELLED") for r in jobs)
    assert len(parents) == 1 and parents[0].info.status == "FAILED"

    res = raco(*args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    jobs, parents = runs(db)
    assert sorted(r.data.params["seed"] for r in jobs if r.info.status == "FINISHED") == ["0", "1"] and len(jobs) == 4
    assert sorted(p.info.status for p in parents) == ["FAILED", "FINISHED"]


@pytest.mark.parametrize(("override", "key"), [
    ("hydra.launcher.mem_gb=100000", "hydra.launcher.mem_gb=100000"),
    ("hydra.launcher.partition=raco_no_such_partition", "hydra.launcher.partition=raco_no_such_partition"),
])
def test_unsatisfiable_request_is_one_line_naming_the_launcher_key(tmp_path, override, key):
    db = tmp_path / "mlflow.db"
    res = raco("train", "--multirun", *TASK, override, "experiment=parkinsons_dp", "seed=0,1", "method.max_steps=10",
               f"tracking.uri=sqlite:///{db}", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path, timeout=300)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: SLURM refused the sweep's jobs (sbatch: ")
    assert key in lines[0] and "Partitions: " in lines[0]
    assert runs(db) == ([], [])  # nothing ran, nothing recorded
    assert not os.path.exists(tmp_path / "sweep" / "0")
