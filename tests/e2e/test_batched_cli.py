"""A grouped sweep (one launcher job trains its runs as one problem) writes what an
ungrouped sweep writes: same run directories, summaries (to the last bit), config hashes and MLflow runs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

FAST = ["dataset=synthetic", "method.batch_size=200", "method.eval_every=10", "method.steps=30", "method.calibrate_noise=true"]


def raco(*args, cwd, timeout=600):
    return subprocess.run([sys.executable, "-m", "raco_cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ))


TIMES = ("wall_time_s", "time_per_step_ms", "first_step_ms", "throughput_images_per_s", "batched", "group_wall_time_s")


def _close(a, b, path=""):
    if isinstance(a, dict):
        assert set(a) - set(TIMES) == set(b) - set(TIMES), path
        for k in set(a) - set(TIMES):
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        assert math.isnan(b), (path, a, b)
    else:  # to the last bit: a grouped run and the run alone are one computation (docs/batched.md, "One path")
        assert a == b, (path, a, b)


@pytest.mark.parametrize("scope", ["paper", pytest.param("model", marks=pytest.mark.slow)])
def test_grouped_sweep_equals_one_job_per_run(tmp_path, scope):
    out = {}
    for group in ("true", "false"):
        sweep = tmp_path / f"sweep_{group}"
        # seeded randomness: under the secret default (scope=model) no two runs share a draw,
        # so only the seeded engine can be compared run for run (the secret one: test_neighbour_replay)
        res = raco("train", "--multirun", *FAST, "seed=0,1", "constraint.gamma=0.02,0.2", f"privacy.scope={scope}", "privacy.secure_rng=false", "constraint.confidence=null",
                   f"hydra.sweeper.group={group}", f"tracking.uri=sqlite:///{tmp_path / (group + '.db')}", f"hydra.sweep.dir={sweep}",
                   cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        out[group] = {n: json.loads((sweep / str(n) / "summary.json").read_text()) for n in range(4)}
        assert not (sweep / "0" / "curves.png").exists()  # tracking.curves=auto: not in sweeps
    assert (tmp_path / "sweep_true" / "groups" / "0").is_dir() and not (tmp_path / "sweep_false" / "groups").exists()
    for n in range(4):
        grouped, alone = out["true"][n], out["false"][n]
        alone.pop("mlflow"), grouped.pop("mlflow")
        _close(alone, grouped)
    if scope == "paper":
        assert out["true"][0]["stats"]["batched"]["runs"] == 4 and "batched" not in out["false"][0]["stats"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'true.db'}")
    runs = client.search_runs([client.get_experiment_by_name("raco").experiment_id])
    children = [r for r in runs if r.data.tags.get("raco.role") != "sweep"]
    assert len(children) == 4 and all(r.info.status == "FINISHED" for r in children)
    assert {r.data.tags["raco.run_dir"] for r in children} == {str(tmp_path / "sweep_true" / str(n)) for n in range(4)}
    assert all(len(client.get_metric_history(r.info.run_id, "test/accuracy")) == 4 for r in children)  # steps 0,10,20,30


@pytest.mark.slow
@pytest.mark.parametrize("method, seeds", [("raco_dp", 8), ("dp_fermi", 6)])
def test_seeds_of_a_planned_scope_model_sweep_train_together_as_each_alone(tmp_path, method, seeds):
    """privacy.scope=model, T planned from each seed's released n~ (RaCO-DP: T 79-88): the runs
    within MIXED_STEPS_SPREAD of the smallest T train as one group to its largest T, and every
    summary equals the ungrouped sweep's (to the last bit).  With 8 seeds on 2 cores or more the group
    plans its runs in parallel (planning.plan_ahead)."""
    from raco_cli.cores import cpu_count
    from raco_cli.methods.planning import PLANS_PER_PROCESS
    from raco_cli.run.group import MIXED_STEPS_SPREAD

    out = {}
    for group in ("true", "false"):
        sweep = tmp_path / f"sweep_{group}"
        res = raco("train", "--multirun", "dataset=synthetic", f"method={method}", "method.batch_size=200", "method.eval_every=10",
                   f"seed=range(0,{seeds})", "privacy.secure_rng=false", "constraint.confidence=null", f"hydra.sweeper.group={group}",
                   f"tracking.uri=sqlite:///{tmp_path / (group + '.db')}", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        out[group] = {n: json.loads((sweep / str(n) / "summary.json").read_text()) for n in range(seeds)}
    logs = "".join(p.read_text() for p in (tmp_path / "sweep_true" / "groups").rglob("*.log"))
    steps = sorted(s["steps"] for s in out["true"].values())
    together = [T for T in steps if T <= MIXED_STEPS_SPREAD * steps[0]]
    assert len(set(together)) > 1 and f"{len(together)} runs trained together (T {together[0]}-{together[-1]})" in logs, (steps, logs)
    assert ("plans computed ahead in parallel" in logs) == (min(cpu_count(), seeds // PLANS_PER_PROCESS) >= 2), logs
    for n in range(seeds):
        grouped, alone = out["true"][n], out["false"][n]
        alone.pop("mlflow"), grouped.pop("mlflow")
        _close(alone, grouped)


def test_runs_in_one_job_equal_one_job_per_run(tmp_path):
    """hydra.sweeper.in_one_job=true: the runs share one launcher job, each trained by the
    one-run path: the same summaries (no batched engine), run directories and MLflow runs as
    one job per run, and a run that fails is recorded FAILED as a job of its own records it."""
    out = {}
    for mode, flags in (("one_job", ["hydra.sweeper.in_one_job=true"]), ("per_run", ["hydra.sweeper.group=false"])):
        sweep = tmp_path / mode
        res = raco("train", "--multirun", *FAST, "seed=0,1", "method=raco_dp,dp_sgd", "privacy.scope=paper", "privacy.secure_rng=false",
                   *flags, f"tracking.uri=sqlite:///{tmp_path / (mode + '.db')}", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        out[mode] = {n: json.loads((sweep / str(n) / "summary.json").read_text()) for n in range(4)}
    assert (tmp_path / "one_job" / "groups" / "0").is_dir() and not (tmp_path / "one_job" / "1" / ".hydra").exists()
    for n in range(4):
        one, alone = out["one_job"][n], out["per_run"][n]
        assert "batched" not in one["stats"]
        one.pop("mlflow"), alone.pop("mlflow")
        _close(alone, one)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'one_job.db'}")
    runs = [r for r in client.search_runs([client.get_experiment_by_name("raco").experiment_id]) if r.data.tags.get("raco.role") != "sweep"]
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)


def test_a_failing_run_in_one_job_is_recorded_and_the_others_train(tmp_path, monkeypatch):
    """A run of an in-one-job launch that fails before its MLflow run exists is recorded FAILED
    (as a job of its own would be) and the next run still trains."""
    from raco_cli.errors import ConfigError
    from raco_cli.run import group, records

    recorded, trained = [], []

    def train(cfg, *, run_dir, sweep_dir):
        if cfg["seed"] == 0:
            raise ConfigError("bad data")
        trained.append(cfg["seed"])
        return {"metrics": {}}

    monkeypatch.setattr(group, "train", train)
    monkeypatch.setattr(group, "prepare_until_plan", lambda *a, **k: pytest.fail("an in-one-job run is prepared by the one-run path"))
    monkeypatch.setattr(records, "record_failure_quietly", lambda cfg, run_dir, sweep_dir, exc: recorded.append((cfg["seed"], str(exc))))
    members = [{"num": s, "run_dir": str(tmp_path / str(s)), "config": {"seed": s}, "alone": True} for s in range(2)]
    summaries = group.train_group(members, sweep_dir=tmp_path, memory_gb=2.0)
    assert summaries == [None, {"metrics": {}}] and trained == [1] and recorded == [(0, "bad data")]
