"""Every method through the CLI on dataset=synthetic: summary.json schema, budget, clear refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

OVERRIDES = {
    "sgd": ["method.steps=20"],
    "sgda": ["method.steps=20"],
    "dp_sgd": ["method.max_steps=20", "method.batch_size=200"],
    "raco_dp": ["method.max_steps=20", "method.batch_size=200"],
    "dp_fermi": ["method.max_steps=20", "method.batch_size=200", "method.options.lam=2"],
    "dpse": ["constraint=none", "method.steps=20"],
}


def raco(*args, cwd):
    return subprocess.run([sys.executable, "-m", "raco_cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


@pytest.mark.parametrize("name", sorted(OVERRIDES))
def test_each_method_writes_a_valid_summary(tmp_path, name):
    from raco_cli.tracking.summary import validate

    run_dir = tmp_path / "run"
    res = raco("train", "dataset=synthetic", "eps=2", f"method={name}", *OVERRIDES[name], "tracking=none",
               f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert validate(summary) == []
    assert summary["method"] == name
    if summary["private"]:
        assert 0 < summary["eps_spent"] <= 2.0
    else:
        assert summary["eps_spent"] is None
    for split in ("train", "val", "test"):
        assert set(summary["metrics"][split]["group_accuracy"]) == {"group0", "group1"}
    if name == "dpse":
        assert summary["sample_rate"] == 1.0
        assert summary["stats"]["releases"]["gaussian_gradient"] == summary["steps"]
    if name == "dp_fermi":
        assert summary["stats"]["releases"]["gaussian_gradient_w"] == summary["steps"]
        assert summary["stats"]["releases"]["gaussian_count"] == 1


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


def test_dp_fermi_rejects_an_unknown_option(tmp_path):
    res = raco("train", "dataset=synthetic", "method=dp_fermi", "+method.options.gamma=0.05", "tracking=none",
               f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "error: Unknown key method.options.gamma for method dp_fermi. Allowed: clip_norm_w, count_floor, "
        "count_noise_multiplier, group_proportions, lam, noise_multiplier_w, w_radius."
    )
