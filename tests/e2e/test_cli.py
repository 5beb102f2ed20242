"""End to end: the installed CLI in subprocesses, from a temporary working directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def raco(*args, cwd, timeout=300, env=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "raco_cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)


def mlflow_runs(db: Path, experiment: str = "raco"):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    return client, ([] if exp is None else client.search_runs([exp.experiment_id]))


def test_help_is_instant_and_imports_nothing_heavy(tmp_path):
    code = (
        "import sys, time; t = time.time(); from raco_cli.cli.main import main; "
        "main(['--help']); main(['train', '--help']); "
        "heavy = [m for m in ('torch', 'mlflow', 'hydra', 'opacus', 'dp_accounting') if m in sys.modules]; "
        "print('HEAVY', heavy); print('TIME', time.time() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path).stdout
    assert "HEAVY []" in out
    assert "config groups" in out and "raco train dataset=adult constraint=dp eps=1" in out


def test_library_modules_do_not_import_hydra_or_mlflow():
    code = (
        "import sys; import raco_cli.privacy.accountant, raco_cli.constraints, raco_cli.methods.sgda.core, raco_cli.metrics.evaluate; "
        "print([m for m in ('hydra', 'mlflow', 'omegaconf') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    assert out == "[]"


def test_train_synthetic_writes_summary_and_mlflow(tmp_path):
    db = tmp_path / "store" / "mlflow.db"
    run_dir = tmp_path / "run"
    # gamma 0.25: the default constraint.confidence's margins of 60 steps on the synthetic table (about 0.15) fit under it
    res = raco("train", "dataset=synthetic", "constraint=dp", "constraint.gamma=0.25", "eps=2", "method.batch_size=200",
               "method.max_steps=60", f"tracking.uri=sqlite:///{db}", "tracking.experiment=e2e", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "test accuracy" in res.stdout and "eps spent" in res.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    from raco_cli.tracking.summary import validate

    assert validate(summary) == []
    assert summary["method"] == "raco_dp" and summary["sampling"] == "independent"
    # eps_spent <= eps alone cannot fail (train.py refuses to write otherwise): recompose the run
    # from its summary with dp-accounting's constructors, independently of raco's accountant
    from oracles import summary_epsilon

    from raco_cli.data import synthetic

    # q = B / n~: the released DP count of the training rows (privacy/size.py), within a few noise sds of n
    assert summary["sample_rate"] == pytest.approx(200 / summary["train_size"])
    assert abs(summary["train_size"] - len(synthetic.load().splits["train"])) < 6 * 50
    assert summary["stats"]["releases"] == {"laplace_histogram": summary["steps"], "gaussian_gradient": summary["steps"]}
    assert summary["eps_spent"] == pytest.approx(summary_epsilon(summary, constrained=True), rel=2e-3)
    assert summary["eps_spent"] <= 2.0
    # privacy.scope=model (the default): test metrics and noisy releases only, no exact
    # training/validation statistic anywhere in the records
    assert summary["privacy_scope"] == "model" and set(summary["metrics"]) == {"test", "release"}
    for key in ("accuracy", "constraint_max_hard", "constraint_max_soft", "satisfied", "dp_gap", "group_accuracy"):
        assert key in summary["metrics"]["test"]
    assert set(summary["group_sizes"]) == {"test"} and set(summary["stats"]) <= {"releases", "sample_rate"}
    # selection=auto is the tail average under scope=model: post-processing, no selection release
    assert summary["selection"] == "average" and "RandomizedResponse" not in summary["event"]
    assert (run_dir / "curves.png").stat().st_size > 1000
    client, runs = mlflow_runs(db, "e2e")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["method"] == "raco_dp" and run.data.tags["dataset"] == "synthetic"
    assert run.data.params["eps"] == "2" or run.data.params["eps"] == "2.0"
    assert "final/test/accuracy" in run.data.metrics and "privacy/eps_spent" in run.data.metrics
    history = client.get_metric_history(run.info.run_id, "test/accuracy")
    assert len(history) >= 2
    assert not [k for k in run.data.metrics if k.split("/")[0] in ("train", "val", "stats") or "/train/" in k or "/val/" in k]
    assert run.data.tags["raco.privacy.scope"] == "model"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "curves.png", "config.yaml"} <= artifacts


def test_bad_config_exits_2_with_one_line_and_writes_nothing(tmp_path):
    db = tmp_path / "mlflow.db"
    cases = {
        "eps=0": "error: eps must be > 0 (got eps=0.0); eps is the total privacy budget of the run.",
        "dataset=adlt": "error: Unknown dataset 'adlt'. Available: acs_employment, adult, celeba, cifar10, credit, digits, fashion_mnist, group_mixture, heart, mnist, parkinsons, synthetic, synthetic_images, table.",
        "constraint.gamma=-1": "error: constraint.gamma must be >= 0 (got -1.0); gamma is the allowed gap of each rate constraint.",
        "delta=1.5": "error: delta must be in (0, 1) (got delta=1.5); delta is the failure probability of the (eps, delta) guarantee, typically 1e-5 or below 1/n.",
    }
    for override, message in cases.items():
        res = raco("train", "dataset=synthetic", override, f"tracking.uri=sqlite:///{db}", cwd=tmp_path)
        assert res.returncode == 2, (override, res.stderr)
        assert res.stderr.strip() == message
        assert "Traceback" not in res.stderr
    assert not db.exists()
    assert not (tmp_path / "outputs").exists()


def test_unreachable_budget_exits_2_before_mlflow(tmp_path):
    db = tmp_path / "mlflow.db"
    res = raco("train", "dataset=synthetic", "eps=0.001", f"tracking.uri=sqlite:///{db}", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error: Cannot reach eps=0.001 (delta=1e-05, sample_rate=")
    assert len(res.stderr.strip().splitlines()) == 1
    assert not db.exists()


def test_multirun_basic_launcher_groups_runs_under_a_parent(tmp_path):
    db = tmp_path / "mlflow.db"
    res = raco("train", "--multirun", "dataset=synthetic", "seed=0,1", "method.max_steps=20", "method.batch_size=200",
               "constraint.confidence=null",  # 20 steps cannot support the default margin at gamma 0.05
               f"tracking.uri=sqlite:///{db}", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    _, runs = mlflow_runs(db)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    parents = [r for r in runs if r.data.tags.get("raco.role") == "sweep"]
    assert len(children) == 2 and len(parents) == 1
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert all((tmp_path / "sweep" / str(i) / "summary.json").exists() for i in (0, 1))


def test_multirun_joblib_launcher(tmp_path):
    db = tmp_path / "mlflow.db"
    res = raco("train", "--multirun", "dataset=synthetic", "seed=0,1", "method.max_steps=20", "method.batch_size=200",
               "constraint.confidence=null",  # 20 steps cannot support the default margin at gamma 0.05
               "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"tracking.uri=sqlite:///{db}",
               f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    _, runs = mlflow_runs(db)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children)


@pytest.mark.data("adult")
def test_train_adult_small_slice(tmp_path):
    run_dir = tmp_path / "run"
    # gamma 0.15: 3 000 rows give margins of about 0.08 at the default constraint.confidence
    res = raco("train", "dataset=adult", "constraint=dp", "constraint.gamma=0.15", "eps=1", "dataset.subset=3000", "tracking=none",
               f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["dataset"] == "adult" and summary["eps_spent"] <= 1.0


def test_privacy_calculator_values(tmp_path):
    base = ["privacy", "epsilon", "--steps", "1000", "--sample-rate", "0.01", "--noise-multiplier", "1",
            "--hist-noise-multiplier", "2", "--delta", "1e-5"]
    t = time.time()
    res = raco(*base, cwd=tmp_path)
    assert time.time() - t < 30
    assert res.returncode == 0
    assert float(res.stdout.strip().splitlines()[-1]) == pytest.approx(1.92, abs=0.02)
    shared = raco(*base, "--sampling", "shared", cwd=tmp_path)
    assert 2.15 <= float(shared.stdout.strip().splitlines()[-1]) <= 2.35
    steps = raco("privacy", "steps", "--eps", "1", "--sample-rate", "0.01", "--noise-multiplier", "1",
                 "--hist-noise-multiplier", "2", "--delta", "1e-5", cwd=tmp_path)
    assert int(steps.stdout.strip().splitlines()[-1]) == 234
    bad = raco("privacy", "epsilon", "--steps", "0", "--sample-rate", "0.01", "--noise-multiplier", "1", cwd=tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
