"""Constraint configs: every family, combinations (constraint=combo / dp+fnr), custom YAML."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from raco_cli.cli.overrides import expand_shorthands
from raco_cli.cli.paths import CONF_DIR
from raco_cli.cli.plugins import register_resolvers
from raco_cli.cli.validate import prevalidate
from raco_cli.constraints import build_parts
from raco_cli.errors import ConfigError
from raco_cli.run.spec import build_run_spec


@pytest.fixture
def spec_of():
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield lambda *overrides: build_run_spec(compose(config_name="config", overrides=expand_shorthands(list(overrides))))
    GlobalHydra.instance().clear()


def _built(spec, K=2, Z=2):
    return build_parts(spec.constraint.parts, n_classes=K, n_groups=Z, class_names=("<=50K", ">50K"),
                       group_names=("Male", "Female"), keys=spec.constraint.keys)  # fmt: skip


@pytest.mark.parametrize(
    "option,gamma,J,Q",
    [("dp", 0.05, 4, 2), ("eo", 0.05, 8, 4), ("fnr", 0.2, 2, 2), ("fpr", 0.1, 1, 2), ("eop", 0.05, 4, 3), ("custom", 0.0, 1, 2)],
)
def test_each_family_config(spec_of, option, gamma, J, Q):
    spec = spec_of(f"constraint={option}")
    assert spec.constraint.name == option and spec.constraint.gamma == gamma
    cs = _built(spec)
    assert (cs.J, cs.Q) == (J, Q)


def test_gamma_override_for_a_single_family(spec_of):
    spec = spec_of("constraint=fnr", "constraint.gamma=0.3", "constraint.positive_class=1")
    cs = _built(spec)
    assert cs.gamma.tolist() == [0.3] and cs.names == ("fnr[positive=1]",)


def test_positive_class_by_name(spec_of):
    cs = _built(spec_of("constraint=fnr", "constraint.positive_class='>50K'"))
    assert cs.names == ("fnr[positive=1]",)


def test_shorthand_combination_and_per_part_gamma(spec_of):
    spec = spec_of("constraint=dp+fnr", "constraint.gamma=0.04", "constraint.families.fnr.gamma=0.2")
    assert spec.constraint.name == "dp+fnr"
    assert [p.family for p in spec.constraint.parts] == ["dp", "fnr"]
    cs = _built(spec)
    assert cs.J == 4 + 2 and cs.Q == 4  # common refinement: label x group
    assert cs.gamma.tolist() == [0.04] * 4 + [0.2] * 2


def test_combo_of_one_part_is_that_family(spec_of):
    spec = spec_of("constraint=combo", "constraint.parts=eo")
    assert spec.constraint.name == "eo" and _built(spec).J == 8


def test_combo_with_custom_and_list_form(spec_of):
    spec = spec_of("constraint=combo", "constraint.parts=[eo,custom]")
    assert spec.constraint.name == "eo+custom"
    cs = _built(spec)
    assert cs.families == ("eo", "custom") and cs.J == 9


def test_shorthand_expansion():
    assert expand_shorthands(["constraint=dp+eo", "seed=1"]) == ["constraint.parts=dp+eo", "constraint=combo", "seed=1"]
    assert expand_shorthands(["--multirun", "constraint=dp,dp+fnr"]) == ["constraint.parts=dp,dp+fnr", "--multirun", "constraint=combo"]
    assert expand_shorthands(["constraint=dp", "constraint.gamma=0.1"]) == ["constraint=dp", "constraint.gamma=0.1"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["constraint=combo", "constraint.parts=dp+fnx"], "Unknown constraint 'fnx'. Available: custom, dp, eo, eop, fnr, fpr."),
        (["constraint=combo", "constraint.parts=dp+dp"], "constraint.parts lists a family twice (got constraint.parts='dp+dp'); each family appears once."),
        (["constraint=combo", "constraint.families.fnr.gamma=-1", "constraint.parts=fnr"],
         "constraint.gamma must be >= 0 (got -1.0); gamma is the allowed gap of each rate constraint."),
        (["constraint=fnr", "constraint.positive_class=[]"],
         "constraint.positive_class must be null, a class name or index, or a list of them (got [])."),
        (["constraint=fnr", "+constraint.foo=1"], "Unknown key constraint.foo for constraint=fnr. Allowed: name, gamma, positive_class."),
        (["constraint=custom", "constraint.constraints=[]"],
         "constraint.constraints must be a non-empty list of rate constraints (got constraint.constraints=[]); see conf/constraint/custom.yaml."),
        (["constraint=custom", "constraint.constraints=[{terms:[{alpha:0,predicted:1}]}]"],
         "constraint.constraints[0].terms[0].alpha must be a finite non-zero number (got constraint.constraints[0].terms[0].alpha=0); "
         "it weighs the rate of this term."),
        (["constraint=combo", "constraint.parts=dp+custom", "constraint.families.custom.constraints=[{terms:[{group:0}]}]"],
         "constraint.families.custom.constraints[0].terms[0].predicted is missing; name the predicted class k whose rate P_k the term takes."),
        (["constraint=dp+fnr", "constraint.families.fnr.confidence=0.95"],
         "constraint.families.fnr.confidence cannot be set per part (got constraint.families.fnr.confidence=0.95); the confidence "
         "covers every constraint of the run at once: set constraint.confidence."),
        (["constraint=dp", "constraint.confidence=1"],
         "constraint.confidence must be auto, null or a probability in (0, 1) (got constraint.confidence=1); the model meets every "
         "rate constraint on new data with at least this probability (auto: 0.9 under privacy.scope=model)."),
    ],
)
def test_constraint_config_errors(spec_of, overrides, message):
    with pytest.raises(ConfigError) as info:
        spec_of(*overrides)
    assert str(info.value) == message


def test_custom_names_are_resolved_against_the_data(spec_of):
    spec = spec_of("constraint=custom", "constraint.constraints=[{terms:[{predicted:1,group:Other}]}]")
    with pytest.raises(ConfigError) as info:
        _built(spec)
    assert str(info.value) == "Unknown group 'Other' in constraint.constraints[0].terms[0].group. Available: Male, Female (or indices 0..1)."


def test_custom_negative_gamma_allowed(spec_of):
    spec = spec_of("constraint=custom", "constraint.gamma=-0.5", "constraint.constraints=[{terms:[{alpha:-1,predicted:1,label:1}]}]")
    assert _built(spec).gamma.tolist() == [-0.5]


def test_prevalidate_sweep_over_combinations():
    prevalidate(expand_shorthands(["--multirun", "constraint=dp,dp+fnr,eo+fnr", "dataset=synthetic"]))
    with pytest.raises(ConfigError, match=r"^Unknown constraint 'fnx'"):
        prevalidate(expand_shorthands(["--multirun", "constraint=dp,dp+fnx"]))


def test_confidence_is_the_runs_in_a_combination(spec_of):
    """The parts' family files bring ``confidence: auto``; the run's constraint.confidence covers them all."""
    assert spec_of("constraint=dp+fnr").constraint.confidence == 0.9
    assert spec_of("constraint=dp+fnr", "constraint.confidence=0.8").constraint.confidence == 0.8
    assert spec_of("constraint=dp+fnr", "privacy.scope=paper").constraint.confidence is None
    assert spec_of("constraint=dp", "constraint.confidence=null").constraint.confidence is None
