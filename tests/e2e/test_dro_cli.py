"""The DRO methods through ``raco train``: end to end, records by scope, replay, refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from raco_cli.privacy import releases

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def raco(*args, cwd):
    env = {**os.environ, "RACO_JOBS": "1"}
    return subprocess.run([sys.executable, "-m", "raco_cli", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=900)


@pytest.mark.slow
def test_dro_methods_run_end_to_end(tmp_path):
    names = ["dp_double_spider", "dp_recursive_spider", "dp_sgda", "dp_private_diff", "spider", "sgda"]
    res = raco("train", "--multirun", "objective=dro", "dataset=synthetic", "eps=2", f"method={','.join(names)}", "method.steps=12",
               "method.batch_size=200", "method.eval_every=6", "method.calibrate_noise=true", "privacy.delta_exponent=1.1",
               "tracking=none", "threads=1", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    summaries = {json.loads(p.read_text())["method"]: json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/summary.json")}
    assert set(summaries) == set(names)
    for s in summaries.values():
        test = s["metrics"]["test"]
        assert np.isfinite(test["grad_norm"]) and np.isfinite(test["dro_objective"]) and "worst_group_accuracy" in test
        if s["private"]:
            n_train = 4000 * 0.75 * 0.85  # conf/dataset/synthetic.yaml n, the shared split
            # scope=model: delta = n~^-1.1 with n~ the released DP count of the training rows (privacy/size.py)
            assert abs(s["train_size"] - n_train) < 6 * 50
            assert s["eps_spent"] <= 2.0 and abs(s["delta"] - s["train_size"] ** -1.1) / s["delta"] < 1e-6
            assert set(s["metrics"]) == {"test", "release"}  # scope=model: no train split, no MIA
            assert s["stats"]["releases"] and "random_iterate_step" in s["stats"]
            # the default output is the last iterate (method.selection=random: the printed random one)
            assert s["selection"] == "last" and s["selected_step"] == 12 and s["stats"]["random_iterate_step"] is None
        else:
            assert "mia" in s["metrics"] and "train" in s["metrics"]


def test_objective_and_method_mismatch_is_one_line(tmp_path):
    res = raco("train", "objective=dro", "method=raco_dp", "dataset=synthetic", "tracking=none", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == (
        "error: method=raco_dp does not optimise objective=dro. Use one of: dp_double_spider, dp_private_diff, "
        "dp_recursive_spider, dp_sgda, sgda, spider."
    )
    res = raco("train", "method=dp_sgda", "dataset=synthetic", "tracking=none", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1] == (
        "error: method=dp_sgda optimises objective=dro only; add objective=dro (docs/dro.md).")
    res = raco("train", "objective=dro", "method=dp_recursive_spider", "objective.divergence=chi2", "dataset=synthetic",
               "tracking=none", cwd=tmp_path)
    assert res.returncode == 2 and "not divergence 'chi2'" in res.stderr


def _train(monkeypatch, tmp_path, name, data, method):
    from raco_cli.cli.validate import compose_config
    from raco_cli.run import prepare
    from raco_cli.run import train as train_mod

    monkeypatch.setattr(prepare, "load_data", lambda spec: data)
    cfg = compose_config([
        "dataset=synthetic", "objective=dro", f"method={method}", "eps=2", "method.batch_size=150", "method.steps=10",
        "method.eval_every=5", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"tracking.run_name={name}",
    ])  # fmt: skip
    return train_mod.train(cfg, run_dir=tmp_path / name), tmp_path / name


@pytest.mark.parametrize("method", ["dp_double_spider", pytest.param("dp_recursive_spider", marks=pytest.mark.slow),
                                    pytest.param("dp_sgda", marks=pytest.mark.slow)])
def test_scope_model_records_are_post_processing_of_the_tape(monkeypatch, tmp_path, method):
    """As tests/e2e/test_replay.py for RaCO-DP: every training and validation record replaced,
    the tape replayed, the same model and summary (the test split's gradient norm included)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
    from test_replay import _data, _replace_rows, _table

    from raco_cli.data.tabular import stratified_split

    df, y, group = _table()
    splits = stratified_split(y, group, seed=0)
    df2 = _replace_rows(df, np.concatenate([splits["train"], splits["val"]]))
    with releases.recording() as tape:
        s1, d1 = _train(monkeypatch, tmp_path, "original", _data(df, y, group, "public"), method)
    with releases.replaying(tape):
        s2, d2 = _train(monkeypatch, tmp_path, "neighbour", _data(df2, y, group, "public"), method)
    assert s1["metrics"]["test"]["grad_norm"] == s2["metrics"]["test"]["grad_norm"]
    for key in ("mlflow", "stats"):
        s1.pop(key), s2.pop(key)
    assert s1 == s2
    a, b = torch.load(d1 / "model.pt"), torch.load(d2 / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (d1 / "curves.png").read_bytes() == (d2 / "curves.png").read_bytes()
    assert sum(tape.kinds().values()) >= 20


def test_one_dro_run_through_the_cli(tmp_path):
    """The acceptance command's shape (``objective=dro method=... eps=1``) on the synthetic data."""
    res = raco("train", "objective=dro", "method=dp_recursive_spider", "dataset=synthetic", "eps=1", "method.steps=10",
               "method.eval_every=5", "tracking=none", "threads=1", "hydra.run.dir=run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["method"] == "dp_recursive_spider" and s["eps_spent"] <= 1.0 and s["privacy_scope"] == "model"
    assert "gaussian_s" in s["event"] or "GaussianDpEvent" in s["event"]
    assert "dp_recursive_spider on synthetic" in res.stdout


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["dro_cifar10_st", "dro_mnist_st", "dro_fashion_mnist"])
def test_gpu_experiment_configs_run_on_cpu(tmp_path, experiment):
    """The paper's ResNet20 configs (conf/experiment/dro_*.yaml, device=cuda) are ready to run: each
    composes, and with the device, data and T overridden trains two steps on the CPU (synthetic
    images stand in for the files, which are not in the test environment)."""
    text = open(os.path.join(ROOT, "conf", "experiment", f"{experiment}.yaml")).read()
    assert "device: cuda" in text and "override /model: resnet20" in text
    drop = [f"~dataset.options.{k}" for k in ("st", "imratio") if f"    {k}:" in text]
    res = raco("train", f"experiment={experiment}", "dataset=synthetic_images", *drop, "dataset.options.n=80", "device=cpu",
               "method.steps=2", "method.eval_every=2", "method.batch_size=8", "privacy.scope=paper", "tracking=none",
               f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["steps"] == 2 and s["hyperparameters"]["objective"]["name"] == "dro"
    assert np.isfinite(s["metrics"]["test"]["dro_objective"])
