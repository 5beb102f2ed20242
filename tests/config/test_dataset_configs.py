"""Dataset configs: every dataset's options are accepted by its loader; experiments compose."""

from __future__ import annotations

import inspect

import pytest

from raco_cli import data
from raco_cli.cli.paths import group_options
from raco_cli.run.spec import build_run_spec


def test_every_dataset_has_a_config_and_a_registry_entry():
    assert set(group_options("dataset")) == set(data.DATASETS)
    assert {"adult", "credit", "parkinsons", "heart", "acs_employment", "celeba"} <= set(data.DATASETS)


@pytest.mark.parametrize("name", sorted(data.DATASETS))
def test_config_options_match_the_loader_defaults(composer, name):
    """Each documented option exists in the loader, with the same default value."""
    spec = build_run_spec(composer([f"dataset={name}"]))
    params = inspect.signature(data.get(name).loader().load).parameters
    for key, value in spec.dataset.options.items():
        assert key in params, f"dataset.options.{key} is not a parameter of {name}.load"
        default = params[key].default
        assert (list(default) if isinstance(default, tuple) else default) == value, key


def test_dataset_defaults_documented_in_the_issue(composer):
    acs = build_run_spec(composer(["dataset=acs_employment"])).dataset.options
    assert (acs["year"], acs["horizon"], acs["states"]) == (2018, "1-Year", ["AL"])
    celeba = build_run_spec(composer(["dataset=celeba"])).dataset.options
    assert (celeba["target"], celeba["sensitive"], celeba["image_size"]) == ("Smiling", "Male", 128)
    assert build_run_spec(composer(["dataset=parkinsons"])).dataset.options["include_motor_updrs"] is True
    assert build_run_spec(composer(["dataset=heart"])).dataset.options["sensitive"] == "Sex"


@pytest.mark.parametrize("experiment,dataset,batch", [("parkinsons_dp", "parkinsons", 256), ("heart_dp", "heart", 4096)])
def test_experiments_compose(composer, experiment, dataset, batch):
    spec = build_run_spec(composer([f"experiment={experiment}"]))
    assert spec.dataset.name == dataset and spec.constraint.name == "dp" and spec.eps == 1.0
    assert spec.method.batch_size == batch


@pytest.mark.parametrize(
    "experiment,method,dataset,gamma,batch",
    [("parkinsons_dp_tuned", "raco_dp", "parkinsons", 0.03, 268), ("parkinsons_dp_fermi_tuned", "dp_fermi", "parkinsons", 0.03, 269),
     ("credit_dp_tuned", "raco_dp", "credit", 0.02, 282), ("credit_dp_fermi_tuned", "dp_fermi", "credit", 0.02, 799),
     ("heart_fnr_tuned", "raco_dp", "heart", 0.6, 645)],
)
def test_tuned_experiments_compose_with_their_study_values(composer, experiment, method, dataset, gamma, batch):
    """The tuned configs carry the study's values where the method reads them (DP-FERMI's
    lambda is method.options.lam, nested)."""
    spec = build_run_spec(composer([f"experiment={experiment}"]))
    assert (spec.method.name, spec.dataset.name, spec.constraint.gamma, spec.method.batch_size) == (method, dataset, gamma, batch)
    if method == "dp_fermi":
        assert spec.method.options["lam"] == pytest.approx({"parkinsons": 0.6460075423716691, "credit": 0.13672194683651975}[dataset])
