"""task=regression end to end: a paper experiment config through `raco train` (summary.json, MLflow
per-group MSPE, the rho budget) and its table through `raco figures`."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def raco(*args, cwd):
    return subprocess.run([sys.executable, "-m", "raco_cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))


SMALL = ["method.steps=5", "method.eval_every=5", "dataset.options.eval_size=40", "dataset.options.sizes=[400,40,40,40,40]"]


def test_dpse_table_experiment_records_group_mspe_and_draws_the_table(tmp_path):
    db = tmp_path / "mlflow.db"
    res = raco("train", "--multirun", "experiment=dpse_table1", "method.options.allocation=sum,uniform", *SMALL,
               f"tracking.uri=sqlite:///{db}", "tracking.experiment=dpse_tables", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "test MSPE group5" in res.stdout and "rho spent (zCDP)" in res.stdout
    from raco_cli.tracking.summary import validate

    summary = json.loads((tmp_path / "sweep" / "0" / "summary.json").read_text())
    assert validate(summary) == [] and summary["task"] == "regression"
    assert summary["rho_target"] == 2.0 and 0.99 * 2.0 <= summary["rho_spent"] <= 2.0
    assert summary["eps_spent"] <= summary["eps_target"]
    assert set(summary["metrics"]["test"]["group_mspe"]) == {f"group{k}" for k in range(1, 6)}
    assert "train" not in summary["metrics"] and "val" not in summary["metrics"]  # scope=model, private
    assert set(summary["stats"]["budget_weights"]) == set(summary["metrics"]["test"]["group_mspe"])

    from raco_cli.tracking.mlflow_store import run_records

    records = run_records(f"sqlite:///{db}", "dpse_tables")
    assert len(records) == 2 and all("final/test/group_mspe/group5" in r["metrics"] for r in records)
    res = raco("figures", "dpse_table1", f"tracking.uri=sqlite:///{db}", "--out", str(tmp_path / "figs"), "--no-log", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    table = (tmp_path / "figs" / "dpse_table1.md").read_text()
    assert "| group1 | 1.02 |" in table and "DPSE vs DPNoSE, % (ours, paired)" in table and "(n=1)" in table
