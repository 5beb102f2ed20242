"""One source of every default: a spec built in Python is the one the command line composes.

``MethodSpec(name=...)`` fills what it is not given from the packaged configs
(:mod:`raco_cli.defaults`), the files ``raco train`` composes, so the two cannot disagree: for
every method, the spec of ``raco train method=<name>`` (its objective group where it needs one)
equals ``MethodSpec(name=<name>)`` field by field, and both are under ``privacy.scope=model``
with secret randomness.
"""

from __future__ import annotations

from dataclasses import fields

import pytest

from raco_cli import defaults, methods
from raco_cli.cli.validate import compose_config
from raco_cli.methods.base import MethodSpec
from raco_cli.run.spec import build_run_spec

DRO = {"dp_double_spider", "dp_recursive_spider", "dp_sgda", "dp_private_diff", "spider"}


def _cli_spec(name: str, *extra: str):
    return build_run_spec(compose_config([f"method={name}", "tracking=none", *(["objective=dro"] if name in DRO else []), *extra]))


@pytest.mark.parametrize("name", list(methods.METHODS))
def test_a_spec_built_in_python_is_the_one_the_cli_composes(name):
    run = _cli_spec(name)
    # (the run-level fields the run sets from eps and the objective group: the same both ways)
    python = MethodSpec(name=name, objective=run.method.objective, selection_eps=run.method.selection_eps)
    for f in fields(MethodSpec):
        assert getattr(python, f.name) == getattr(run.method, f.name), f.name
    assert python == run.method


def test_the_privacy_scope_is_model_everywhere_by_default():
    """The command line, a bare MethodSpec and the run spec all default to scope=model with
    secret randomness (the paper's looser scope only when asked for)."""
    assert defaults.privacy_scope() == "model"
    spec = MethodSpec(name="raco_dp")
    assert spec.scope == "model" and spec.secure_rng is True and spec.selection == "average"
    assert _cli_spec("raco_dp").scope == "model"
    paper = MethodSpec(name="raco_dp", scope="paper")
    assert paper.secure_rng is False and paper.selection == "best_feasible"  # auto, resolved by the scope
    assert _cli_spec("raco_dp", "privacy.scope=paper").method == paper


def test_a_setting_given_in_python_or_on_the_command_line_wins_over_the_file():
    assert MethodSpec(name="dp_sgd", lr=0.25).lr == 0.25 != defaults.method_defaults("dp_sgd")["lr"]
    assert _cli_spec("dp_sgd", "method.lr=0.25").method == MethodSpec(name="dp_sgd", lr=0.25)


def test_auto_settings_hold_placeholders_until_the_run_resolves_them():
    """batch_size / lr_dual / dual = auto are resolved from the data by prepare_run; until then
    both ways of building a spec hold the same placeholders, and the run spec says auto."""
    run = _cli_spec("raco_dp")
    assert defaults.method_defaults("raco_dp")["batch_size"] == "auto" and run.auto_batch and run.auto_lr_dual and run.auto_dual
    spec = MethodSpec(name="raco_dp")
    assert (spec.batch_size, spec.lr_dual, spec.dual) == (1024, 0.1, "soft") == tuple(defaults.AUTO_PLACEHOLDERS.values())
