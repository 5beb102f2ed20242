"""Two private searches (``raco tune``, privacy.scope=model) on two tables of one's own, as a new
user runs them (issue 57): each leaves its own complete result folder, named after its table,
and prints raco train's result table with the released model's fairness rows on the test split."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from raco_cli.data.fixtures import people_frame

FAST = ["constraint=dp", "eps=2", "constraint.gamma=0.1", "method.max_steps=40", "method.eval_every=20", "method.batch_size=128",
        "tune.candidates=1", "tune.repetitions=fixed", "tune.mean=1", "tracking=none"]


def _raco(*args, cwd):
    return subprocess.run([sys.executable, "-m", "raco_cli", *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.mark.slow  # two searches planned and run, ~40 s on 2 cores
def test_two_searches_on_two_tables_leave_two_complete_folders_with_their_fairness_rows(tmp_path):
    people_frame(3000, seed=0).to_csv(tmp_path / "people.csv", index=False)
    people_frame(3000, seed=1).rename(columns={"approved": "granted"}).to_csv(tmp_path / "clinic.csv", index=False)
    for name, label in (("people", "approved"), ("clinic", "granted")):
        res = _raco("data", "describe", f"{name}.csv", "--label", label, "--sensitive", "sex", "--out", f"conf/dataset/{name}.yaml",
                    cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    outs = {}
    for name in ("people", "clinic", "people"):  # the same table twice: a second search never replaces the first
        res = _raco("tune", "--config-dir", "conf", f"dataset={name}", *FAST, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        outs.setdefault(name, []).append(res.stdout)
    tune = tmp_path / "outputs" / "tune"
    folders = sorted(p.name for p in tune.iterdir())
    assert folders == ["private-raco_dp-clinic-dp-eps2-gamma0.1-1", "private-raco_dp-people-dp-eps2-gamma0.1-1",
                       "private-raco_dp-people-dp-eps2-gamma0.1-2"]
    for folder in folders:
        run = tune / folder / "best"
        assert {"summary.json", "model.pt", "config.yaml", "model"} <= {p.name for p in run.iterdir()}, folder
        assert (tune / folder / "best.yaml").read_text().startswith("# @package _global_")
        summary = json.loads((run / "summary.json").read_text())
        assert summary["dataset"] == folder.split("-")[2] and summary["search"]["eps_covers"] == "the search"
        assert summary["satisfied"] is summary["metrics"]["test"]["satisfied"]  # the released model on the test split
    for name, stdouts in outs.items():
        for k, stdout in enumerate(stdouts, start=1):
            test = json.loads((tune / f"private-raco_dp-{name}-dp-eps2-gamma0.1-{k}" / "best" / "summary.json").read_text())["metrics"]["test"]
            verdict = "holds" if test["constraints"]["dp"]["satisfied"] else "VIOLATED"
            assert re.search(rf"^raco_dp on {name} \(dp, gamma=0\.1\)$", stdout, re.M), stdout
            assert re.search(rf"^  test dp max Gamma    \d\.\d{{4}}   \(gamma 0\.1: {verdict} on the test split\)$", stdout, re.M), stdout
            assert f"private-raco_dp-{name}-dp-eps2-gamma0.1-{k}/best/summary.json" in stdout
