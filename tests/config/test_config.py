"""Config composition: every group option composes and validates; bad values give exact messages."""

from __future__ import annotations

import pytest

from raco_cli.cli.paths import group_options
from raco_cli.cli.validate import prevalidate
from raco_cli.errors import ConfigError
from raco_cli.run.spec import build_run_spec


def test_defaults(composer):
    spec = build_run_spec(composer())
    assert (spec.dataset.name, spec.constraint.name, spec.method.name) == ("adult", "dp", "raco_dp")
    assert spec.eps == 1.0 and spec.delta == 1e-5 and spec.seed == 0
    assert spec.constraint.gamma == 0.05
    assert spec.tracking.uri == "sqlite:///outputs/mlflow.db"
    assert spec.method.sampling == "independent"


@pytest.mark.parametrize("group", ["dataset", "constraint", "method", "model", "objective", "tracking", "debug"])
def test_every_group_option_composes(composer, group):
    from raco_cli import methods

    for option in group_options(group):
        dro_only = group == "method" and "erm" not in methods.objectives_of(option)
        extra = ["objective=dro"] if dro_only else ["method=dp_sgda"] if (group, option) == ("objective", "dro") else []
        cfg = composer([f"{group}={option}", *extra])
        spec = build_run_spec(cfg)
        if group == "model":
            assert spec.model["name"] == option
        elif group == "constraint" and option == "combo":
            assert spec.constraint.name == "dp+fnr"  # the default parts of conf/constraint/combo.yaml
        elif group in ("dataset", "constraint", "method"):
            assert getattr(spec, group).name == option
        elif group == "objective":
            assert spec.method.objective.name == option


@pytest.mark.parametrize(
    "override,message",
    [
        ("eps=0", "eps must be > 0 (got eps=0.0); eps is the total privacy budget of the run."),
        ("eps=-1", "eps must be > 0 (got eps=-1.0); eps is the total privacy budget of the run."),
        ("eps=abc", "eps must be a number (got eps='abc'); eps is the total privacy budget of the run."),
        ("delta=0", "delta must be in (0, 1) (got delta=0.0); delta is the failure probability of the (eps, delta) guarantee, typically 1e-5 or below 1/n."),
        ("delta=1", "delta must be in (0, 1) (got delta=1.0); delta is the failure probability of the (eps, delta) guarantee, typically 1e-5 or below 1/n."),
        ("constraint.gamma=-0.05", "constraint.gamma must be >= 0 (got -0.05); gamma is the allowed gap of each rate constraint."),
        ("method.lr=0", "method.lr must be > 0 (got method.lr=0.0); the primal learning rate."),
        ("method.batch_size=0", "method.batch_size must be > 0 (got method.batch_size=0); the expected Poisson batch size."),
        ("method.sampling=joint", "method.sampling must be one of independent, shared (got method.sampling='joint'); how histogram and gradient batches are drawn."),
        ("dataset.name=adlt", "Unknown dataset 'adlt'. Available: acs_employment, adult, celeba, cifar10, credit, digits, fashion_mnist, group_mixture, heart, mnist, parkinsons, synthetic, synthetic_images, table."),
    ],
)
def test_bad_values_exact_messages(composer, override, message):
    with pytest.raises(ConfigError) as info:
        build_run_spec(composer([override]))
    assert str(info.value) == message


@pytest.mark.parametrize(
    "args,message",
    [
        (["dataset=adlt"], "Unknown dataset 'adlt'. Available: acs_employment, adult, celeba, cifar10, credit, digits, fashion_mnist, group_mixture, heart, mnist, parkinsons, synthetic, synthetic_images, table."),
        (["method=foo"], "Unknown method 'foo'. Available: dp_double_spider, dp_fermi, dp_private_diff, dp_recursive_spider, dp_sgd, dp_sgda, dpse, raco_dp, sgd, sgda, spider."),
        (["constraint=xx"], "Unknown constraint 'xx'. Available: combo, custom, dp, eo, eop, fnr, fpr, none."),
        (["--multirun", "eps=1,0"], "eps must be > 0 (got eps=0.0); eps is the total privacy budget of the run."),
        (["--multirun", "seed=0,1", "constraint.gamma=0.1,-2"], "constraint.gamma must be >= 0 (got -2.0); gamma is the allowed gap of each rate constraint."),
    ],
)
def test_prevalidate_messages(args, message):
    with pytest.raises(ConfigError) as info:
        prevalidate(args)
    assert str(info.value) == message


def test_prevalidate_unknown_key():
    with pytest.raises(ConfigError, match=r"Key 'lrr' is not in the config"):
        prevalidate(["method.lrr=3"])


def test_prevalidate_accepts_valid_sweeps_and_hydra_overrides():
    prevalidate(["--multirun", "eps=0.5,1", "seed=range(0,3)", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"])
