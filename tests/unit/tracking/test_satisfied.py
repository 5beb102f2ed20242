"""summary.json's top-level ``satisfied`` means one thing for every command: the released model
meets every constraint's gamma (as asked for) on the held-out test split.  The training-side
signal (noisy histograms under scope=model, the exact training split otherwise) is printed
and recorded as such, never as ``satisfied`` (issue 57: ``satisfied: True`` beside a test DP
gap of 0.152 at gamma 0.05)."""

from __future__ import annotations

from pathlib import Path

from raco_cli.cli.result_table import format_result
from raco_cli.tracking.summary import (
    TEST,
    released,
    released_model_satisfied,
    status_of,
    training_signal,
)


def _summary(*, test_ok: bool, release_ok: bool | None, scope: str = "model") -> dict:
    test = {"accuracy": 0.8, "satisfied": test_ok, "violation_hard": -0.01 if test_ok else 0.1,
            "constraints": {"dp": {"names": ["dp"], "values_hard": [0.04 if test_ok else 0.152], "gamma": [0.05],
                                   "max_hard": 0.04 if test_ok else 0.152, "satisfied": test_ok}}}
    metrics: dict = {"test": test}
    if scope == "model":
        metrics["release"] = {"noisy_violation": -0.02 if release_ok else 0.03, "satisfied": release_ok}
    else:
        metrics["train"] = {"accuracy": 0.81, "satisfied": release_ok}
    return {"method": "raco_dp", "dataset": "people", "constraint": "dp", "gamma": 0.05, "metrics": metrics,
            "privacy_scope": scope, "private": True, "secure_rng": True, "satisfied": released_model_satisfied(metrics),
            "eps_spent": 0.99, "eps_target": 1.0, "delta": 1e-5, "steps": 100, "selected_step": 100}


def test_satisfied_is_the_test_splits_verdict_not_the_training_signal():
    s = _summary(test_ok=False, release_ok=True)
    assert s["satisfied"] is False and training_signal(s) is True
    assert _summary(test_ok=True, release_ok=False)["satisfied"] is True
    assert released_model_satisfied({}) is None  # no test split evaluated: nothing claimed


def test_it_is_a_test_split_value_under_scope_model():
    assert status_of("satisfied") == TEST
    s = _summary(test_ok=False, release_ok=True)
    kept = released(s, scope="model", private=True)
    assert kept["satisfied"] is False and kept["metrics"]["release"]["satisfied"] is True


def test_the_result_table_shows_the_verdict_on_test_and_the_signal_as_training_side(tmp_path: Path):
    text = format_result(_summary(test_ok=False, release_ok=True), tmp_path)
    assert "(gamma 0.05: VIOLATED on the test split)" in text
    assert "training signal      noisy histograms at the training target: feasible (a training-side signal" in text
    paper = format_result(_summary(test_ok=True, release_ok=False, scope="paper"), tmp_path)
    assert "(gamma 0.05: holds on the test split)" in paper
    assert "training constraint  violated on the training split (exact)" in paper
