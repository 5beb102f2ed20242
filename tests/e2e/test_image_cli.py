"""End to end on images: `raco train experiment=celeba_resnet16` (paper App. E.7 settings,
shrunk: a narrow ResNet16, 2 steps) on the synthetic CelebA fixture (official file layout),
on CPU and (marked gpu) on CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TINY = (
    "experiment=celeba_resnet16", "dataset.options.image_size=16", "dataset.options.verify_checksums=false",
    "model.width=0.125", "model.groups=4", "eps=9",
    "method.batch_size=8", "method.steps=2", "method.eval_every=2", "method.micro_batch=4",
)


def raco(*args, cwd):
    return subprocess.run([sys.executable, "-m", "raco_cli", *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=dict(os.environ))


def _two_step_run(tmp_path, device):
    from raco_cli.data import fixtures

    fixtures.write_celeba(tmp_path / "mirror", n=60)
    db = tmp_path / "mlflow.db"
    run_dir = tmp_path / "run"
    res = raco("train", *TINY, "privacy.scope=paper", f"dataset.mirror={tmp_path / 'mirror'}", f"device={device}", f"tracking.uri=sqlite:///{db}",
               f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    from raco_cli.tracking.summary import validate

    assert validate(summary) == []
    assert (summary["method"], summary["dataset"], summary["steps"]) == ("raco_dp", "celeba", 2)
    assert summary["eps_spent"] <= 9.0 and summary["hyperparameters"]["noise_multiplier"] == 1.2
    assert summary["stats"]["releases"] == {"laplace_histogram": 2, "gaussian_gradient": 2}
    assert summary["stats"]["throughput_images_per_s"] > 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    run = client.search_runs([client.get_experiment_by_name("fig2a_celeba").experiment_id])[0]
    assert run.data.metrics["throughput_images_per_s"] > 0 and run.data.params["model.name"] == "resnet16"
    return summary


def test_two_step_raco_dp_resnet16_on_images_writes_summary(tmp_path):
    _two_step_run(tmp_path, "cpu")


@pytest.mark.gpu
def test_two_step_raco_dp_resnet16_on_gpu(tmp_path):
    _two_step_run(tmp_path, "cuda")


def test_resnet16_on_tabular_data_exits_2_before_mlflow(tmp_path):
    db = tmp_path / "mlflow.db"
    res = raco("train", "dataset=synthetic", "model=resnet16", f"tracking.uri=sqlite:///{db}", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "error: model=resnet16 cannot be built for input shape (8,): it needs image rows of shape (C, H, W); "
        "use model=logreg or model=mlp for tabular data"
    )
    assert not db.exists()
