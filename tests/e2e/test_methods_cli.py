"""Every method through the CLI on dataset=synthetic: summary.json schema, budget, clear refusals.

raco_dp's run is ``tests/e2e/test_cli.py::test_train_synthetic_writes_summary_and_mlflow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raco_cli.data import synthetic

N_TRAIN = len(synthetic.load().splits["train"])  # dataset=synthetic's defaults (conf/dataset/synthetic.yaml)


def raco(*args, cwd):
    return subprocess.run([sys.executable, "-m", "raco_cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))


def _check(summary, name):
    from raco_cli.tracking.summary import validate

    assert validate(summary) == []
    assert summary["method"] == name
    if summary["private"]:
        # eps_spent <= eps alone cannot fail (train.py refuses to write otherwise): recompose
        # the run from its summary, independently of raco's accountant and event trees
        from oracles import summary_epsilon

        assert summary["eps_spent"] == pytest.approx(summary_epsilon(summary, constrained=name != "dpse"), rel=2e-3)
        assert 0 < summary["eps_spent"] <= 2.0
        if name != "dpse":
            # q = B / n~ (the released DP count of the training rows), as trained
            assert summary["sample_rate"] == pytest.approx(200 / summary["train_size"]) and abs(summary["train_size"] - N_TRAIN) < 300
    else:
        assert summary["eps_spent"] is None
    model_scope = summary["private"] and summary["privacy_scope"] == "model"
    for split in ("test",) if model_scope else ("train", "val", "test"):
        assert set(summary["metrics"][split]["group_accuracy"]) == {"group0", "group1"}
    if model_scope:  # no exact training/validation statistic in the record
        assert "train" not in summary["metrics"] and "val" not in summary["metrics"]


def test_each_method_writes_a_valid_summary(tmp_path):
    # one process for the four methods that take constraint=dp (a multirun: one start-up cost)
    names = ["sgd", "sgda", "dp_sgd", "dp_fermi"]
    res = raco("train", "--multirun", "dataset=synthetic", "eps=2", f"method={','.join(names)}", "method.steps=20",
               "method.batch_size=200", "tracking=none", "constraint.confidence=null",  # sgda's exact-count margin > 0.05 here
               f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for i, name in enumerate(names):
        summary = json.loads((tmp_path / "sweep" / str(i) / "summary.json").read_text())
        _check(summary, name)
        if name == "dp_fermi":
            assert summary["stats"]["releases"]["gaussian_gradient_w"] == summary["steps"] == 20
            assert summary["stats"]["releases"]["gaussian_count"] == 1
    run_dir = tmp_path / "dpse"
    res = raco("train", "dataset=synthetic", "eps=2", "method=dpse", "constraint=none", "method.steps=20",
               "tracking=none", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    _check(summary, "dpse")
    assert summary["sample_rate"] == 1.0
    assert summary["stats"]["releases"]["gaussian_gradient"] == summary["steps"] == 20


def test_dpse_refuses_a_rate_constraint_in_one_line(tmp_path):
    db = tmp_path / "mlflow.db"
    res = raco("train", "dataset=synthetic", "method=dpse", "constraint=dp", f"tracking.uri=sqlite:///{db}",
               f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "error: method=dpse does not model the rate constraint 'dp' (its fairness notion is bounded group loss, "
        "set by method.options.bgl_penalty and bgl_eta). Use constraint=none."
    )
    assert not db.exists()
