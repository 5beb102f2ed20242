"""The run layer reads a config as plain dicts without importing OmegaConf: the command line
converts Hydra's DictConfig (cli/job_config.py), and run/spec.py's ``plain_config`` reads any other
mapping key by key.  Both give the same containers, values and types, so a run's files, MLflow
params and config hash do not depend on who converted its config."""

from __future__ import annotations

import pytest

from raco_cli.cli.job_config import plain_job
from raco_cli.cli.paths import CONF_DIR
from raco_cli.cli.validate import compose_job
from raco_cli.run.spec import config_hash, plain_config

JOBS = [
    ["dataset=synthetic", "dataset.split_seed=${seed}", "seed=7"],  # an interpolation of the job's own key
    ["constraint.parts=dp+fnr", "constraint=combo", "constraint.families.fnr.gamma=0.2"],  # a combination of families
    ["dataset=adult", "method=dp_fermi", "method.options.lam=4"],
    ["objective=dro", "method=dp_double_spider", "dataset=synthetic", "constraint=none"],
    *[[f"experiment={p.stem}"] for p in sorted((CONF_DIR / "experiment").glob("*.yaml"))],
]


def _typed(value):
    """A container's value with every leaf's type beside it (1 == 1.0 == True otherwise)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


@pytest.mark.parametrize("overrides", JOBS, ids=[" ".join(j) for j in JOBS])
def test_a_dictconfig_read_as_a_mapping_is_what_omegaconf_converts(overrides):
    cfg = compose_job(overrides)
    plain = plain_job(cfg)
    read = plain_config(cfg)
    assert type(read) is dict and _typed(read) == _typed(plain)
    assert config_hash(read) == config_hash(plain)


def test_a_plain_dict_is_copied_as_it_is():
    nested = {"name": "sgd"}
    cfg = {"eps": 1, "method": nested, "parts": ("dp",)}
    out = plain_config(cfg)
    assert out == cfg and out is not cfg
    assert out["method"] is nested and out["parts"] == ("dp",)  # one level, as before: the run layer's own copy
