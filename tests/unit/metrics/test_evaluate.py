"""Evaluation metrics, cross-checked against fairlearn."""

from __future__ import annotations

import numpy as np
import pytest
from fairlearn.metrics import (
    demographic_parity_difference,
    equal_opportunity_difference,
    equalized_odds_difference,
)

from raco_cli.constraints import build
from raco_cli.metrics.evaluate import evaluate, fairness_metrics


@pytest.mark.parametrize("n_groups", [2, 3, 5])
def test_gaps_equal_fairlearn(n_groups):
    rng = np.random.default_rng(n_groups)
    n = 2000
    y = rng.integers(0, 2, n)
    group = rng.integers(0, n_groups, n)
    pred = (rng.random(n) < 0.3 + 0.1 * group).astype(int)
    ours = fairness_metrics(y, pred, group, n_classes=2, n_groups=n_groups)
    assert ours["dp_gap"] == pytest.approx(demographic_parity_difference(y, pred, sensitive_features=group))
    assert ours["eo_gap"] == pytest.approx(equalized_odds_difference(y, pred, sensitive_features=group))
    assert ours["eop_gap"] == pytest.approx(equal_opportunity_difference(y, pred, sensitive_features=group))
    assert ours["fnr"] == pytest.approx(((pred == 0) & (y == 1)).sum() / (y == 1).sum())
    assert ours["fpr"] == pytest.approx(((pred == 1) & (y == 0)).sum() / (y == 0).sum())


def test_rigged_evaluation(rigged):
    y, group, pred = rigged
    logits = np.stack([1.0 - pred, pred.astype(float)], axis=1) * 5
    cs = build("dp", n_classes=2, n_groups=2, gamma=0.4)
    m = evaluate(logits, y, group, constraints=cs, temperature=1.0, group_names=("a", "b"))
    assert m["dp_gap"] == pytest.approx(0.5)
    assert m["constraint_max_hard"] == pytest.approx(0.5)
    assert m["violation_hard"] == pytest.approx(0.1)
    assert m["satisfied"] is False
    assert m["accuracy"] == pytest.approx(np.mean(pred == y))
    assert m["group_accuracy"] == {"a": pytest.approx(0.75), "b": pytest.approx(0.75)}
    assert m["group_positive_rate"] == {"a": pytest.approx(0.75), "b": pytest.approx(0.25)}
    # two groups: the max DP constraint value equals the DP gap
    assert m["constraint_max_hard"] == pytest.approx(m["dp_gap"])


def test_empty_group_in_split_is_reported_not_fatal():
    y = np.array([0, 1, 0, 1])
    group = np.zeros(4, dtype=int)  # group 1 has no rows in this split
    logits = np.array([[2.0, 0.0], [0.0, 2.0], [0.0, 2.0], [2.0, 0.0]])
    cs = build("dp", n_classes=2, n_groups=2, gamma=0.05)
    m = evaluate(logits, y, group, constraints=cs, temperature=1.0, group_names=("a", "b"))
    assert m["group_accuracy"]["b"] is None
    assert m["dp_gap"] == 0.0
    assert np.isfinite(m["constraint_max_hard"])
