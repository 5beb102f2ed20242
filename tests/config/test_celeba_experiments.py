"""The CelebA ResNet16 experiments (paper App. E.7) and the Fig. 2a sweep grid compose with
the paper's settings.  Until the CelebA loader exists, conf/ is copied with a stub
dataset/celeba.yaml so that only the composition (not the data) is checked."""

from __future__ import annotations

import shutil

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from raco_cli import data
from raco_cli.cli.paths import CONF_DIR, SWEEPS_DIR
from raco_cli.cli.plugins import register_resolvers
from raco_cli.run.spec import build_run_spec


@pytest.fixture
def composer(tmp_path):
    conf = CONF_DIR
    if not (CONF_DIR / "dataset" / "celeba.yaml").exists():
        conf = tmp_path / "conf"
        shutil.copytree(CONF_DIR, conf)
        (conf / "dataset" / "celeba.yaml").write_text("name: celeba\nsplit_seed: 0\nsubset: null\ndownload: false\nmirror: null\noptions: {}\n")
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        yield lambda overrides: compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()


@pytest.mark.parametrize(
    "experiment,method,eps,lr,sigma,hist",
    [
        ("celeba_resnet16", "raco_dp", 1.0, 0.2, 1.2, 2.0),
        ("celeba_resnet16_eps9", "raco_dp", 9.0, 0.2, 0.6, 2.0),
        ("celeba_resnet16_sgda", "sgda", 1.0, 0.01, None, None),
    ],
)
def test_celeba_experiments_have_the_paper_settings(composer, experiment, method, eps, lr, sigma, hist):
    cfg = composer([f"experiment={experiment}", "constraint.gamma=0.075"])
    assert (cfg.dataset.name, cfg.model.name, cfg.constraint.name, cfg.method.name) == ("celeba", "resnet16", "dp", method)
    assert cfg.model.groups == 16 and list(cfg.model.blocks) == [2, 2, 2, 1]
    assert cfg.method.batch_size == 256 and cfg.method.lr == lr and cfg.eps == eps
    assert cfg.method.noise_multiplier == sigma and cfg.method.hist_noise_multiplier == hist
    assert cfg.constraint.gamma == 0.075 and cfg.tracking.experiment == "fig2a_celeba"
    if "celeba" in data.DATASETS:
        spec = build_run_spec(cfg)
        assert spec.method.batch_size == 256


def test_dp_sgd_reference_overrides_the_experiment_method(composer):
    cfg = composer(["experiment=celeba_resnet16", "method=dp_sgd", "constraint=none"])
    assert cfg.method.name == "dp_sgd" and cfg.method.noise_multiplier == 1.2 and cfg.method.lr == 0.2


def test_fig2a_sweep_grids():
    from raco_cli.cli.sweep_plan import plan_jobs

    sweeper = yaml.safe_load((SWEEPS_DIR / "fig2a_celeba.yaml").read_text())["hydra"]["sweeper"]
    grids = sweeper["grids"]
    assert grids["raco_dp"]["experiment"].split(",") == ["celeba_resnet16", "celeba_resnet16_eps9"]
    assert grids["sgda"]["experiment"] == "celeba_resnet16_sgda"
    assert [float(g) for g in grids["raco_dp"]["constraint.gamma"].split(",")] == [1, 0.1, 0.075, 0.05]
    assert grids["raco_dp"]["seed"] == "range(0,5)"
    jobs = plan_jobs(grids, None, [])
    assert [sum(1 for n, _ in jobs if n == g) for g in ("raco_dp", "sgda", "dp_sgd")] == [40, 20, 10]
    experiments = {e for g in grids.values() for e in g["experiment"].split(",")}
    assert all((CONF_DIR / "experiment" / f"{e}.yaml").exists() for e in experiments)
