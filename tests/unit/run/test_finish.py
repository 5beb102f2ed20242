"""The pieces of a run's finish (raco_cli/run/finish.py) that decide what its summary says: where
its hyperparameters came from, the gammas its constraint metrics are read against, the
hyperparameters as plain containers."""

from __future__ import annotations

import dataclasses
import importlib
from types import SimpleNamespace

import numpy as np

from raco_cli.methods.base import MethodSpec
from raco_cli.run import finish


def _spec(tuned_on, dataset="adult"):
    return SimpleNamespace(tuned_on=tuned_on, dataset=SimpleNamespace(name=dataset))


def test_values_tuned_non_privately_on_this_dataset_are_outside_eps():
    assert finish.tuned_on(_spec(None)) is None and finish.tuned_on(_spec({})) is None
    here = {"dataset": "adult", "split": "train/val", "protocol": "non-private"}
    assert finish.tuned_on(_spec(here)) == {**here, "outside_eps": True}
    assert finish.tuned_on(_spec(here, dataset="credit"))["outside_eps"] is False  # tuned on another dataset
    private = {"dataset": "adult", "protocol": "private", "search_eps": 1.0}  # a private search's best.yaml
    assert finish.tuned_on(_spec(private)) == {**private, "outside_eps": False}


def test_constraint_metrics_are_read_against_the_gammas_asked_for_but_the_release_against_training(monkeypatch):
    evaluate = importlib.import_module("raco_cli.metrics.evaluate")  # (raco_cli.metrics.evaluate is also a function's name)
    calls = []

    def against(metrics, gamma, families):
        calls.append((metrics, list(gamma), families))
        return {"against": metrics["name"]}

    monkeypatch.setattr(evaluate, "against_gamma", against)
    requested = SimpleNamespace(gamma=np.array([0.05, 0.2]), families=("dp", "fnr"), family_indices=lambda f: [0] if f == "dp" else [1])
    release = {"noisy_violation": -0.01}
    out = finish.requested_metrics({"test": {"name": "test"}, "release": release, "train": {"name": "train"}}, requested)
    assert out == {"test": {"against": "test"}, "release": release, "train": {"against": "train"}} and out["release"] is release
    assert [c[0]["name"] for c in calls] == ["test", "train"]
    assert all(c[1] == [0.05, 0.2] and c[2] == {"dp": [0], "fnr": [1]} for c in calls)


def test_the_hyperparameters_are_plain_containers():
    spec = MethodSpec(name="dp_fermi", batch_size=128, options={"lam": 4.0})
    out = finish.spec_dict(spec)
    assert out["name"] == "dp_fermi" and out["batch_size"] == 128 and out["noise_multiplier"] == spec.noise_multiplier
    assert type(out["options"]) is dict and out["options"] == {"lam": 4.0} and out["options"] is not spec.options
    assert set(out) == {f.name for f in dataclasses.fields(MethodSpec)}  # every field, none added


def test_a_gamma_shared_by_every_constraint_is_drawn_on_the_curves():
    assert finish.common_gamma(np.array([0.05, 0.05]), 0.1) == 0.05
    assert finish.common_gamma(np.array([]), 0.1) == 0.1  # no constraint: the configured gamma
    assert finish.common_gamma(np.array([0.05, 0.2]), 0.1) is None  # dp+fnr at two gammas: no single line
