"""raco from Python: ``raco_cli.train`` is ``raco train`` without the shell, ``raco_cli.load``
reads a run back, and the released model predicts what the run's test metrics were computed
from."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import raco_cli
from raco_cli.errors import ConfigError

FAST = ["dataset=synthetic", "method.batch_size=200", "method.eval_every=10", "method.steps=30", "method.calibrate_noise=true",
        "privacy.secure_rng=false", "tracking=none"]


def test_importing_raco_cli_stays_light():
    """``import raco_cli`` names the API without importing torch, Hydra or scikit-learn."""
    code = "import sys, raco_cli; print(all(m not in sys.modules for m in ('torch', 'hydra', 'sklearn', 'mlflow')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ}, timeout=60)
    assert out.stdout.strip() == "True", out.stderr
    assert set(raco_cli.__all__) >= {"train", "load", "Result", "RacoClassifier"}


def test_train_from_python_writes_the_run_the_command_line_writes(tmp_path):
    """The same overrides through raco_cli.train and through ``raco train`` (seeded): the same
    summary, but for where and when it ran."""
    res = raco_cli.train(FAST, run_dir=tmp_path / "py")
    cli = subprocess.run([sys.executable, "-m", "raco_cli", "train", *FAST, f"hydra.run.dir={tmp_path / 'cli'}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr
    mine, theirs = res.summary, json.loads((tmp_path / "cli" / "summary.json").read_text())
    for key in ("eps_spent", "steps", "selected_step", "metrics", "lambda", "hyperparameters", "config_hash"):
        assert mine[key] == theirs[key], key
    assert res.run_dir == tmp_path / "py" and (res.run_dir / "model.pt").is_file()
    assert res.eps_spent == pytest.approx(mine["eps_spent"]) and 0 < res.eps_spent <= 1.0
    assert res.satisfied == mine["satisfied"] and res.test["accuracy"] == mine["metrics"]["test"]["accuracy"]


def test_a_mapping_of_overrides_and_load_give_the_same_run(tmp_path):
    overrides = dict(item.split("=", 1) for item in FAST)
    overrides["constraint.gamma"] = 0.1
    res = raco_cli.train(overrides, run_dir=tmp_path / "run")
    back = raco_cli.load(tmp_path / "run")
    assert back.summary == res.summary and back.config == res.config
    assert back.summary["gamma"] == 0.1


def test_the_released_model_predicts_what_its_test_accuracy_says(tmp_path):
    """Result.model rebuilt from model.pt and config.yaml gives, on the test rows in the run's
    encoding (here the public bounds alone: no DP standardisation), the run's own test accuracy."""
    from raco_cli.data import synthetic

    res = raco_cli.train([*FAST, "dataset.preprocessing=public"], run_dir=tmp_path / "run")
    data = synthetic.load(preprocessing="public", split="record")  # the config defaults (n 4000, 8 features, seed 0), scope=model split
    test = np.asarray(data.splits["test"])
    accuracy = float((res.predict(np.asarray(data.X)[test]) == data.y[test]).mean())
    assert accuracy == pytest.approx(res.test["accuracy"], abs=1e-12)
    proba = res.predict_proba(np.asarray(data.X)[test[:5]])
    assert proba.shape == (5, 2) and np.allclose(proba.sum(axis=1), 1.0)


def test_errors_are_the_command_lines_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="eps"):
        raco_cli.train([*FAST, "eps=0"], run_dir=tmp_path / "bad")
    assert not (tmp_path / "bad" / "summary.json").exists()
    with pytest.raises(ConfigError, match="list of key=value strings"):
        raco_cli.train("dataset=adult")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="holds no finished run"):
        raco_cli.load(tmp_path)
